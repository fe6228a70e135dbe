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

    .venv/bin/python perf/gc_pause.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "perf"))

from llamacpp_step import save  # noqa: E402

from tritonforge.bench.environment import capture  # noqa: E402
from tritonforge.bench.noise import RoundWatch  # noqa: E402
from tritonforge.launch.launcher import server_environment  # noqa: E402

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


def probe(kind: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, kind, json.dumps(ENGINES), str(REPO)],
        env=server_environment(),
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{kind}: probe failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", nargs="+", default=[*ENGINES, "openai_frontend"])
    parser.add_argument("--out", type=Path, default=REPO / "perf/results/gc-pause")
    opts = parser.parse_args()
    model_dir = Path(server_environment()["TRITONFORGE_MODELS"]) / "SmolLM2-135M-Instruct"
    record: dict = {"environment": capture(model_dir).model_dump(), "rows": []}
    kinds = list(opts.kinds)
    for index in range(opts.rounds):
        shift = index % len(kinds)
        for kind in kinds[shift:] + kinds[:shift]:
            with RoundWatch(quiet_window_s=2.0) as watch:
                result = probe(kind)
            assert watch.sample is not None
            row = {"round": index, "kind": kind, **result, "noise": watch.sample.model_dump()}
            record["rows"].append(row)
            before, after = result["before"], result["after"]
            print(
                f"round {index} {kind}: {before['objects']:,} objects, full pass "
                f"{before['full_pass_ms']['median']:.1f} ms; frozen {result['frozen']:,}, "
                f"then {after['objects']:,} objects, {after['full_pass_ms']['median']:.3f} ms",
                flush=True,
            )
    save(record, opts.out)


if __name__ == "__main__":
    main()
