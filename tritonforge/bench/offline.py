"""The engine's offline ceiling: vLLM's ``LLMEngine`` driven in-process, no server.

Run as its own process (``python -m tritonforge.bench.offline``) so the engine's memory
and threads are gone when it ends. For each level it keeps exactly ``concurrency``
requests in the engine — a new one is added as soon as one finishes — which is the
same closed loop a load tool applies to a server, minus every server and network cost.
That makes "Triton tok/s ÷ offline tok/s" the share of the engine the serving path keeps.

Input: a JSON job (engine settings, warm-up and per-level workload files). Output: a
JSON file of per-level request records (or the error that stopped a level).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tritonforge.bench.metrics import MeasuredRequest
from tritonforge.bench.workload import BenchRequest, read_workload
from tritonforge.engines.host_settings import for_this_host


def engine_kwargs(settings: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Keep the keys ``LLM`` accepts; model.json may carry AsyncEngineArgs-only ones."""
    from vllm.engine.arg_utils import EngineArgs

    known = set(EngineArgs.__dataclass_fields__)
    kept = {k: v for k, v in settings.items() if k in known}
    return kept, sorted(set(settings) - known)


def closed_loop(
    engine: Any, requests: list[BenchRequest], concurrency: int, sampling: dict
) -> list[MeasuredRequest]:
    """Keep ``concurrency`` requests in flight until all are done; time every token."""
    from vllm import SamplingParams

    pending = list(reversed(requests))
    live: dict[str, MeasuredRequest] = {}
    seen_tokens: dict[str, int] = {}
    last_token_ns: dict[str, int] = {}
    done: list[MeasuredRequest] = []

    def admit() -> None:
        while pending and len(live) < concurrency:
            request = pending.pop()
            rid = f"r{request.index}"
            params = SamplingParams(max_tokens=request.output_tokens, **sampling)
            now = time.perf_counter_ns()
            live[rid] = MeasuredRequest(
                index=request.index,
                start_ns=now,
                end_ns=now,
                ok=False,
                expected_tokens=request.output_tokens if sampling.get("ignore_eos") else None,
            )
            seen_tokens[rid] = 0
            engine.add_request(rid, request.prompt, params)

    admit()
    while live:
        outputs = engine.step()
        now = time.perf_counter_ns()
        for output in outputs:
            record = live.get(output.request_id)
            if record is None:
                continue
            count = len(output.outputs[0].token_ids) if output.outputs else 0
            if count > seen_tokens[output.request_id]:
                if record.ttft_ms is None:
                    record.ttft_ms = (now - record.start_ns) / 1e6
                else:
                    record.chunk_gaps_ms.append((now - last_token_ns[output.request_id]) / 1e6)
                last_token_ns[output.request_id] = now
                seen_tokens[output.request_id] = count
            if output.finished:
                record.end_ns = now
                record.output_tokens = count
                record.ok = True  # ended without error; fewer tokens than forced is "short"
                record.finish_reason = output.outputs[0].finish_reason if output.outputs else None
                done.append(live.pop(output.request_id))
        admit()
    return done


def run(job: dict[str, Any]) -> dict[str, Any]:
    # vLLM's default engine-core process, as the servers run it. The in-process core
    # (VLLM_ENABLE_V1_MULTIPROCESSING=0) keeps two OpenMP threads spinning in the step
    # loop; next to any other busy process on two cores it ran 10x slower here.
    from vllm import LLM
    from vllm.config import SchedulerConfig
    from vllm.platforms import current_platform

    # The settings the Triton model's adapter resolves for this host (dtype, threads).
    host = for_this_host(job["engine_settings"], current_platform.is_cpu())
    os.environ.update(host.env)
    kwargs, dropped = engine_kwargs(host.engine)
    notes = list(host.reasons)
    if dropped:
        notes.append(f"not LLM arguments, left out: {', '.join(dropped)}")
    if "max_num_batched_tokens" not in kwargs:
        # LLM's own CPU default (4096) differs from the servers' (2048): unpinned, the
        # ceiling would run another scheduler budget than the targets it is compared to.
        kwargs["max_num_batched_tokens"] = SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS
        notes.append(
            f"max_num_batched_tokens not in model.json: set to the servers' default "
            f"{kwargs['max_num_batched_tokens']} (LLM's own CPU default is 4096)"
        )
    started = time.monotonic()
    llm = LLM(**kwargs)
    engine = llm.llm_engine
    startup_s = time.monotonic() - started
    config = engine.vllm_config
    notes.append(
        "effective: max_num_batched_tokens "
        f"{config.scheduler_config.max_num_batched_tokens}, max_num_seqs "
        f"{config.scheduler_config.max_num_seqs}, block_size {config.cache_config.block_size}, "
        f"prefix caching {config.cache_config.enable_prefix_caching}"
    )
    sampling = job["sampling"]
    warmup = read_workload(Path(job["warmup"])) if job.get("warmup") else []
    if warmup:
        closed_loop(engine, warmup, max(1, min(len(warmup), 4)), sampling)
    levels = []
    for level in job["levels"]:
        round_ = int(level.get("round", 0))
        requests = read_workload(Path(level["workload"]))
        deadline_s = float(job["max_duration_s"])
        began = time.monotonic()
        try:
            records = closed_loop(engine, requests, int(level["level"]), sampling)
            error = None
            if time.monotonic() - began > deadline_s:
                error = f"took longer than max_duration_s ({deadline_s:g} s)"
        except Exception as exc:  # a level's failure is reported, the next level still runs
            records, error = [], f"{type(exc).__name__}: {exc}"
        levels.append(
            {
                "level": level["level"],
                "round": round_,
                "records": [asdict(r) for r in records],
                "error": error,
            }
        )
    return {"startup_s": startup_s, "notes": notes, "levels": levels}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="vLLM offline ceiling for a benchmark run")
    parser.add_argument("job", type=Path, help="job JSON written by the runner")
    parser.add_argument("out", type=Path, help="where to write the per-level records")
    args = parser.parse_args(argv)
    result = run(json.loads(args.job.read_text()))
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
