"""llama.cpp's own step times for the serving context's settings (offline, no Triton).

Why: the llama.cpp adapter builds one context for ``n_parallel`` sequences; whether its
KV cache is unified across sequences (``kv_unified``) and whether attention uses
``flash_attn`` are chosen by these numbers. Each *config* runs in a process of its own
(interleaved rounds, order rotated): the model.json of ``model_repository/llamacpp_model``
with the config's keys overridden, ``n_parallel`` sequences holding a ~40-token prompt
each, then the median time of a decode step at batch 1 and at batch ``n_parallel``, of a
64-token prompt block, and whether a sequence's logits are bit-for-bit the same alone
and beside the others (greedy tokens of 16 steps, alone vs batched).

    python -m tritonforge.bench.probes.llamacpp_step --rounds 3 \\
        --config 'split+fa={"kv_unified": false, "flash_attn": true}' \\
        --config 'unified+fa={"kv_unified": true, "flash_attn": true}'

Writes ``perf/results/llamacpp-step/<UTC timestamp>/results.json``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from tritonforge.bench.probes.harness import (
    interleaved,
    model_dir,
    probe_environment,
    run_program,
    save,
)
from tritonforge.engines.config import resolve_path
from tritonforge.launch.launcher import MODEL_REPOSITORY, server_environment

PROBE = r"""
import json, statistics, sys, time
import numpy as np, llama_cpp as L
settings = json.loads(sys.argv[1]); slots = settings["n_parallel"]
L.llama_backend_init()
path = settings["model_path"].encode()
model = L.llama_model_load_from_file(path, L.llama_model_default_params())
params = L.llama_context_default_params()
params.n_ctx, params.n_batch, params.n_ubatch = slots * settings["n_ctx"], 512, 512
params.n_seq_max = slots
params.n_threads, params.n_threads_batch = settings["n_threads"], settings["n_threads_batch"]
params.flash_attn = settings.get("flash_attn", False)
params.kv_unified = settings.get("kv_unified", False)
ctx = L.llama_init_from_model(model, params); memory = L.llama_get_memory(ctx)
n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
batch = L.llama_batch_init(512, 0, 1)
def decode(items):
    batch.n_tokens = len(items)
    for i, (t, p, s) in enumerate(items):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, p, 1
        batch.seq_id[i][0], batch.logits[i] = s, 1
    assert L.llama_decode(ctx, batch) == 0
def row(i):
    return np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy()
def greedy(seqs, steps=16):
    L.llama_memory_clear(memory, True)
    nxt = {}
    for s in seqs:
        decode([(100 + 7 * s + i, i, s) for i in range(40)])
        nxt[s] = int(np.argmax(row(39)))
    out = {s: [] for s in seqs}
    for step in range(steps):
        decode([(nxt[s], 40 + step, s) for s in seqs])
        for i, s in enumerate(seqs):
            out[s].append(nxt[s]); nxt[s] = int(np.argmax(row(i)))
    return out
same = greedy([0])[0] == greedy(list(range(slots)))[0]
def timed(fn, n=15):
    times = []
    for _ in range(n):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    return round(statistics.median(times) * 1000, 2)
position = [56]
def step(k):
    decode([(100, position[0], s) for s in range(k)]); position[0] += 1
one = timed(lambda: step(1))
for s in range(1, slots):  # every sequence at the same length again
    decode([(100, p, s) for p in range(56, position[0])])
many = timed(lambda: step(slots))
def block():
    L.llama_memory_seq_rm(memory, 0, position[0], -1)
    decode([(100 + i, position[0] + i, 0) for i in range(64)])
result = {"step_1_ms": one, f"step_{slots}_ms": many, "block_64_ms": timed(block)}
print("RESULT" + json.dumps(result | {"batched_equals_alone": same}))
"""


def run_config(settings: dict[str, Any]) -> dict[str, Any]:
    """One config's step times, measured in a process of its own."""
    return run_program(PROBE, [json.dumps(settings)], timeout_s=600)


def shipped_settings() -> dict[str, Any]:
    """``llamacpp_model``'s model.json, its GGUF path resolved for this host."""
    env = server_environment()
    version_dir = MODEL_REPOSITORY / "llamacpp_model/1"
    shipped: dict[str, Any] = json.loads((version_dir / "model.json").read_text())
    shipped["model_path"] = resolve_path(shipped["model_path"], version_dir, env)
    return shipped


def probe_configs(
    configs: dict[str, dict[str, Any]], base: dict[str, Any], rounds: int
) -> list[dict[str, Any]]:
    """Every config (``base`` with its overrides) in interleaved rounds."""
    return interleaved(
        list(configs), rounds, lambda name: run_config(base | configs[name]), "config"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", action="append", required=True, help="name=JSON overrides")
    parser.add_argument("--rounds", type=int, default=3)
    return parser


def main(argv: list[str] | None = None) -> None:
    opts = build_parser().parse_args(argv)
    configs = {c.split("=", 1)[0]: json.loads(c.split("=", 1)[1]) for c in opts.config}
    shipped = shipped_settings()
    record: dict[str, Any] = {"environment": probe_environment(model_dir()), "configs": configs}
    record["shipped"] = shipped
    record["rows"] = probe_configs(configs, shipped, opts.rounds)
    save(record, "llamacpp-step")


if __name__ == "__main__":
    main()
