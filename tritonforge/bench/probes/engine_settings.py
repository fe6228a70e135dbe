"""Offline vLLM under candidate engine settings: start-up, prefill, decode step, memory.

Why: the engine settings the adapter picks per host (dtype, OpenMP thread binding,
eager vs compiled graphs) must each rest on a measurement on that host. This tool runs
vLLM's own ``LLM`` engine (multiprocessing on, as inside Triton's stub) once per
candidate in a fresh process, in interleaved rounds with the candidates' order rotated,
and records per round: start-up seconds, prefill and median decode step at each batch
size, the process tree's memory (PSS), and the foreign CPU share while it ran.

    python -m tritonforge.bench.probes.engine_settings --rounds 3 \\
        --candidate old:dtype=bfloat16,bind=auto --candidate new:dtype=bfloat16,bind=all

Candidate keys: ``dtype``, ``bind`` (``auto`` = vLLM's own, ``all`` = every core this
process may use, or a literal VLLM_CPU_OMP_THREADS_BIND value), ``eager`` (1/0). The
engine settings are ``model_repository/vllm_model/1/model.json`` with those replaced.
Results go to ``perf/results/engine-settings/<UTC timestamp>/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from tritonforge.bench.probes.harness import (
    ProbeFailed,
    interleaved,
    probe_environment,
    run_program,
    save,
)
from tritonforge.engines.base import CHAT_TEMPLATE_KEY
from tritonforge.engines.config import load_engine_config, resolve_paths
from tritonforge.launch.launcher import MODEL_REPOSITORY, server_environment
from tritonforge.paths import REPO_ROOT

CHILD = r"""
import json, os, random, statistics, sys, time
import psutil
from vllm import LLM, SamplingParams

args, spec = json.loads(sys.argv[1]), json.loads(sys.argv[2])
started = time.perf_counter()
llm = LLM(**args)
startup_s = time.perf_counter() - started
engine = llm.llm_engine
from tritonforge.bench.workload import random_words
rng = random.Random(spec["seed"])
serial = iter(range(10**9))


def run(batch, prompt_words, tokens):
    # One batch stepped by hand: the first step that gives every request a token is
    # the prefill; every later step is one decode step for the whole batch.
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    for _ in range(batch):
        text = random_words(rng, prompt_words)
        engine.add_request(f"r{next(serial)}", text, params)
    steps, got, t0 = [], set(), time.perf_counter()
    prefill = None
    while engine.has_unfinished_requests():
        begin = time.perf_counter()
        outputs = engine.step()
        now = time.perf_counter()
        got |= {o.request_id for o in outputs if o.outputs and o.outputs[0].token_ids}
        if prefill is None:
            if len(got) == batch:
                prefill = now - t0
        else:
            steps.append(now - begin)
    return {"prefill_ms": round(prefill * 1000, 1),
            "step_ms": round(statistics.median(steps) * 1000, 2),
            "tokens_per_s": round(batch * tokens / (time.perf_counter() - t0), 1)}


def pss_mib():
    me = psutil.Process()
    total = 0
    for proc in [me, *me.children(recursive=True)]:
        try:
            total += proc.memory_full_info().pss
        except psutil.Error:
            pass
    return round(total / 2**20)


run(2, 40, 4)  # warm-up
out = {"startup_s": round(startup_s, 1), "long_prefill": run(1, spec["long_words"], 2)}
for batch in spec["batches"]:
    out[f"batch_{batch}"] = run(batch, spec["prompt_words"], spec["tokens"])
out["pss_mib"] = pss_mib()
print("RESULT" + json.dumps(out), flush=True)
"""


def _shown(path: Path) -> str:
    """A path as results record it: relative to the clone when inside it."""
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else path.name


def parse_candidate(text: str) -> tuple[str, dict[str, str]]:
    """``name:key=value,...`` → (name, {key: value}); unknown keys are refused by name."""
    name, _, body = text.partition(":")
    fields = dict(item.split("=", 1) for item in body.split(",") if item)
    unknown = set(fields) - {"dtype", "bind", "eager"}
    if not name or unknown:
        raise SystemExit(
            f"--candidate {text!r}: want name:dtype=..,bind=..,eager=..; bad {unknown}"
        )
    return name, fields


def child_env(base: dict[str, str], bind: str) -> dict[str, str]:
    env = {**base, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    env.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    if bind == "all":
        cores = sorted(os.sched_getaffinity(0))
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
    elif bind != "auto":
        env["VLLM_CPU_OMP_THREADS_BIND"] = bind
    return env


def run_candidate(
    settings: dict[str, Any], fields: dict[str, str], spec: dict[str, Any], env: dict[str, str]
) -> dict[str, Any]:
    """One candidate's engine in a process of its own; its figures, or the error it ended in."""
    args = {**settings, "dtype": fields.get("dtype", settings.get("dtype", "auto"))}
    args["enforce_eager"] = fields.get("eager", "1") == "1"
    try:
        return run_program(
            CHILD,
            [json.dumps(args), json.dumps(spec)],
            env=child_env(env, fields.get("bind", "auto")),
            timeout_s=3600,
        )
    except ProbeFailed as failure:
        return {"error": str(failure)[-3000:]}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--candidate", action="append", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--tokens", type=int, default=33)
    parser.add_argument("--prompt-words", type=int, default=40)
    parser.add_argument("--long-words", type=int, default=400)
    return parser


def main(argv: list[str] | None = None) -> None:
    opts = build_parser().parse_args(argv)
    candidates = dict(parse_candidate(text) for text in opts.candidate)
    env = server_environment()
    os.environ["TRITONFORGE_MODELS"] = env["TRITONFORGE_MODELS"]
    version_dir = MODEL_REPOSITORY / "vllm_model/1"
    settings = resolve_paths(load_engine_config(version_dir, "model.json"), version_dir, ("model",))
    settings.pop(CHAT_TEMPLATE_KEY, None)  # the core's own key, not an engine argument
    rounds = iter(range(10**9))

    def measure(name: str) -> dict[str, Any]:
        spec = {
            "seed": next(rounds) // len(candidates),  # the round's seed, as every candidate's
            "batches": [int(b) for b in opts.batches.split(",")],
            "tokens": opts.tokens,
            "prompt_words": opts.prompt_words,
            "long_words": opts.long_words,
        }
        return run_candidate(settings, candidates[name], spec, env)

    record: dict[str, Any] = {
        "environment": probe_environment(Path(settings["model"])),
        "engine_settings": {**settings, "model": _shown(Path(settings["model"]))},
        "candidates": candidates,
    }
    record["rounds"] = interleaved(list(candidates), opts.rounds, measure, "candidate")
    save(record, "engine-settings")


if __name__ == "__main__":
    main()
