"""Tokenizer benchmark: C++ `preprocessing` vs Python `preprocessing_py`, pybind11 vs HF.

Why this shape: the question is whether the C++ backend takes the tokenizer off the request
path — server-side latency (queue + compute as Triton itself reports it, so network and
client costs cannot blur the comparison) of both models in the same server on the same
100- and 2,000-token prompts, measured by perf_analyzer; and whether the pybind11 module
is at least as fast as HF `tokenizers` from Python.

    python -m tritonforge.bench.probes.tokenizer   # -> perf/results/tokenizer/<UTC>/

Needs the built tokenizer (scripts/build_tokenizer.sh), the default model
(python -m tritonforge.launch.model_store) and perf_analyzer (scripts/setup_bench_venv.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tritonforge_tokenizer as tt
from tokenizers import Tokenizer as HfTokenizer

from tritonforge.bench.environment import (
    Environment,
    capture,
    describe_machine,
    tritonserver_version,
)
from tritonforge.bench.perf_analyzer_driver import server_latency
from tritonforge.bench.tools import tool_binary
from tritonforge.launch.launcher import TritonServer
from tritonforge.paths import CACHE_DIR, REPO_ROOT, make_machine_free, new_run_dir

TOKENIZER_FILE = CACHE_DIR / "models" / "SmolLM2-135M-Instruct" / "tokenizer.json"
MODELS = ("preprocessing", "preprocessing_py")
PROMPT_TOKENS = (100, 2000)


def prompt_of(hf: HfTokenizer, tokens: int) -> str:
    """Real English text (this repository's Python sources) cut to exactly `tokens` ids."""
    source = "\n".join(p.read_text() for p in sorted((REPO_ROOT / "tritonforge").rglob("*.py")))
    ids = hf.encode(source).ids
    if len(ids) < tokens:
        raise SystemExit(f"not enough source text for a {tokens}-token prompt")
    cut = tokens
    while True:  # decoding a prefix may re-encode to one id more or less: adjust
        text = hf.decode(ids[:cut])
        count = len(hf.encode(text).ids)
        if count == tokens:
            return text
        cut += tokens - count


def python_encode_speed(text: str, hf: HfTokenizer, ours: tt.Tokenizer) -> dict[str, float]:
    """Best-of-5 mean µs per call: encode one prompt, and a 64-prompt batch."""

    def best(stmt: Callable[[], object], number: int) -> float:
        return min(timeit.repeat(stmt, number=number, repeat=5)) / number * 1e6

    batch = [text] * 64
    assert ours.encode(text) == hf.encode(text).ids
    number = 2000 if len(text) < 2000 else 100
    return {
        "hf_encode_us": best(lambda: hf.encode(text).ids, number),
        "pybind_encode_us": best(lambda: ours.encode(text), number),
        "hf_encode_batch64_us": best(lambda: [e.ids for e in hf.encode_batch(batch)], 20),
        "pybind_encode_batch64_us": best(lambda: ours.encode_batch(batch), 20),
    }


def report(results: dict[str, Any], env: Environment) -> str:
    versions = {
        "tritonserver": env.tritonserver,
        **{name: env.serving_versions[name] for name in ("python", "tokenizers")},
        "perf_analyzer": env.bench_versions.get("perf_analyzer", "?"),
        "tritonforge_commit": env.git_commit[:12],
    }
    lines = [
        "# Tokenizer benchmark",
        "",
        f"{results['date']} · {describe_machine(env.machine)} · "
        + ", ".join(f"{k} {v}" for k, v in versions.items()),
        "",
        "## Server-side latency per request (perf_analyzer, gRPC, concurrency 1, `-s 50`)",
        "",
        "| prompt | C++ `preprocessing` µs | Python `preprocessing_py` µs | C++ / Python "
        "| client p50 C++ / Python µs |",
        "|---|---|---|---|---|",
    ]
    for tokens in PROMPT_TOKENS:
        cpp = results["server"][f"{tokens}"]["preprocessing"]
        py = results["server"][f"{tokens}"]["preprocessing_py"]
        lines.append(
            f"| {tokens} tokens | {cpp['server_latency_us']:.0f} | {py['server_latency_us']:.0f} | "
            f"{cpp['server_latency_us'] / py['server_latency_us']:.2f}× | "
            f"{cpp['client_p50_latency_us']:.0f} / {py['client_p50_latency_us']:.0f} |"
        )
    lines += [
        "",
        "Server latency = queue + compute input + compute infer + compute output, as Triton "
        "reports it per request (the C++ backend stops its clock once the outputs are filled, "
        "before handing the response over, like Triton's own backends). Client p50 is the "
        "whole round trip. Target: C++ ≤ 0.25× Python. Load average when the run "
        f"started: {results['load_average_at_start']:.1f} on {env.machine.cores} cores.",
        "",
        "## Encode from Python (best of 5, µs per call)",
        "",
        "| prompt | HF `tokenizers` | pybind11 | HF batch×64 | pybind11 batch×64 |",
        "|---|---|---|---|---|",
    ]
    for tokens in PROMPT_TOKENS:
        r = results["python"][f"{tokens}"]
        lines.append(
            f"| {tokens} tokens | {r['hf_encode_us']:.1f} | {r['pybind_encode_us']:.1f} | "
            f"{r['hf_encode_batch64_us']:.0f} | {r['pybind_encode_batch64_us']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "perf" / "results" / "tokenizer")
    args = parser.parse_args(argv)
    tool_binary("perf_analyzer")  # missing: refused before anything starts
    hf = HfTokenizer.from_file(str(TOKENIZER_FILE))
    ours = tt.Tokenizer.from_file(str(TOKENIZER_FILE))
    run_dir = new_run_dir(args.out)
    stamp = run_dir.name
    prompts = {tokens: prompt_of(hf, tokens) for tokens in PROMPT_TOKENS}
    env = capture(TOKENIZER_FILE.parent)
    results: dict[str, Any] = {
        "date": stamp,
        # Other work on the machine shows up here and in the spread of the numbers.
        "load_average_at_start": os.getloadavg()[0],
        "prompt_tokens": {str(t): len(hf.encode(p).ids) for t, p in prompts.items()},
        "python": {str(t): python_encode_speed(p, hf, ours) for t, p in prompts.items()},
        "server": {},
    }
    server = TritonServer.on_free_ports(models=list(MODELS), log_path=run_dir / "server.log")
    server.start()
    try:
        server.wait_ready(300)
        env.tritonserver = tritonserver_version(server.http_url)
        for tokens, text in prompts.items():
            results["server"][str(tokens)] = {
                model: server_latency(server.grpc_url, model, text, run_dir / f"pa_{tokens}")
                for model in MODELS
            }
            print(f"{tokens} tokens: {json.dumps(results['server'][str(tokens)])}", flush=True)
            time.sleep(1)
    finally:
        server.stop()
    results["environment"] = env.model_dump(mode="json")
    (run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (run_dir / "report.md").write_text(report(results, env))
    make_machine_free(run_dir)
    print(report(results, env))
    return 0


if __name__ == "__main__":
    sys.exit(main())
