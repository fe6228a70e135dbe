"""How long a full pass of the cyclic garbage collector holds the GIL in a serving process.

Why: a stub or the OpenAI frontend holds hundreds of thousands of start-up objects for
its whole life; CPython's full collection walks all of them while every stream of the
process waits. ``tritonforge.heap.freeze_startup_heap`` (called once start-up is done)
moves them out of the collector's reach. This measures, per kind of process, the full
pass before and after that call.

Each kind is built in a fresh process the way the server builds it: an engine from its
shipped ``model_repository`` directory, started (the vLLM engine starts its EngineCore
process; the measured heap is the stub side's), or the OpenAI frontend's app. Outside
tritonserver, so the stub's own few objects (``triton_python_backend_utils``) are not
counted: a lower bound of a stub's heap. Kinds run in rotated order, one process each
per round.

    python -m tritonforge.bench.probes.gc_pause --rounds 3
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
from tritonforge.launch.launcher import server_environment
from tritonforge.paths import REPO_ROOT

#: Engine kinds: the class and the shipped model directory it is built from.
ENGINES = {
    "synthetic_model": "tritonforge.engines.synthetic:SyntheticEngine",
    "vllm_model": "tritonforge.engines.vllm:VllmEngine",
    "llamacpp_model": "tritonforge.engines.llamacpp:LlamaCppEngine",
}

PROBE = r"""
import asyncio, gc, json, pkgutil, statistics, sys, time
from pathlib import Path

import tritonforge.serving.runtime  # what every LLM stub imports beside its engine
from tritonforge.engines.config import load_engine_config
from tritonforge.heap import freeze_startup_heap

kind, engines, repo = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])


def passes(count=5):
    times = []
    for _ in range(count):
        start = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - start) * 1000)
    return {"min": min(times), "median": statistics.median(times), "max": max(times)}


def measure():
    before = {"objects": len(gc.get_objects()), "full_pass_ms": passes()}
    frozen = freeze_startup_heap()
    after = {"objects": len(gc.get_objects()), "full_pass_ms": passes()}
    gc.unfreeze()
    return {"before": before, "frozen": frozen, "after": after}


async def engine_probe():
    version = repo / "model_repository" / kind / "1"
    engine_class = pkgutil.resolve_name(engines[kind])
    engine = engine_class.from_config(
        load_engine_config(version, engine_class.config_file.name), version
    )
    await engine.start()
    try:
        return measure()
    finally:
        await engine.shutdown()


if kind == "openai_frontend":
    from tritonforge.openai.app import create_app

    app = create_app("127.0.0.1:8001")
    result = measure()
else:
    result = asyncio.run(engine_probe())
print("RESULT" + json.dumps(result))
"""


def probe(kind: str) -> dict[str, Any]:
    """One kind of serving process built in a fresh interpreter; its passes before/after."""
    result = run_program(
        PROBE, [kind, json.dumps(ENGINES), str(REPO_ROOT)], env=server_environment(), timeout_s=600
    )
    before, after = result["before"], result["after"]
    print(
        f"{kind}: {before['objects']:,} objects, full pass "
        f"{before['full_pass_ms']['median']:.1f} ms; frozen {result['frozen']:,}, "
        f"then {after['objects']:,} objects, {after['full_pass_ms']['median']:.3f} ms",
        flush=True,
    )
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", nargs="+", default=[*ENGINES, "openai_frontend"])
    return parser


def main(argv: list[str] | None = None) -> None:
    opts = build_parser().parse_args(argv)
    record: dict[str, Any] = {"environment": probe_environment(model_dir())}
    record["rows"] = interleaved(list(opts.kinds), opts.rounds, probe, "kind")
    save(record, "gc-pause")


if __name__ == "__main__":
    main()
