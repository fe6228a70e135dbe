"""The offline probes' harness: a fresh process per measurement, rounds rotated, noise kept."""

from __future__ import annotations

import json
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from tritonforge.bench.probes import (
    embeddings,
    engine_settings,
    gc_pause,
    gguf_types,
    harness,
    llamacpp_step,
    runtime_cost,
)
from tritonforge.paths import REPO_ROOT


class QuietWatch:
    """RoundWatch without its sampling window: the harness only reads ``sample``."""

    def __init__(self, **_: Any) -> None:
        self.sample: Any = None

    def __enter__(self) -> QuietWatch:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.sample = type("Sample", (), {"model_dump": lambda _: {"foreign_cpu_share": 0.0}})()


def test_a_probe_program_runs_in_a_fresh_process_and_returns_its_result_line() -> None:
    program = "import json, sys; print('noise'); print('RESULT' + json.dumps({'x': sys.argv[1]}))"
    assert harness.run_program(program, ["7"]) == {"x": "7"}


def test_a_probe_that_prints_no_result_fails_with_its_error() -> None:
    with pytest.raises(harness.ProbeFailed, match="boom"):
        harness.run_program("raise SystemExit('boom')")


def test_candidates_run_once_a_round_in_rotated_order_with_noise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(harness, "RoundWatch", QuietWatch)
    rows = harness.interleaved(["a", "b"], 2, lambda name: {"value": name * 2}, "kind")
    assert [(r["round"], r["kind"], r["value"]) for r in rows] == [
        (0, "a", "aa"),
        (0, "b", "bb"),
        (1, "b", "bb"),
        (1, "a", "aa"),
    ]
    assert all(r["noise"] == {"foreign_cpu_share": 0.0} for r in rows)


def test_a_record_is_saved_as_a_new_run_without_machine_paths(tmp_path: Path) -> None:
    out = harness.save({"model": str(REPO_ROOT / "model_repository/x")}, "probe", root=tmp_path)
    assert out.parent == tmp_path / "probe"
    assert json.loads((out / "results.json").read_text()) == {"model": "model_repository/x"}


@pytest.mark.parametrize(
    ("parser", "argv"),
    [
        (llamacpp_step.build_parser(), ["--config", 'fa={"flash_attn": true}']),
        (gguf_types.build_parser(), ["--types", "Q8_0", "--rounds", "1"]),
        (gc_pause.build_parser(), ["--kinds", "synthetic_model"]),
        (runtime_cost.build_parser(), ["HEAD~1", "HEAD"]),
        (engine_settings.build_parser(), ["--candidate", "new:dtype=bfloat16,bind=all"]),
        (embeddings.build_parser(), ["--rounds", "5"]),
    ],
)
def test_every_probe_takes_its_documented_arguments(parser: Any, argv: list[str]) -> None:
    assert parser.parse_args(argv)


def test_a_served_probe_reads_tritons_own_latency_from_perf_analyzers_csv(tmp_path: Path) -> None:
    from tritonforge.bench.perf_analyzer_driver import read_server_latency

    csv_path = tmp_path / "m.csv"
    csv_path.write_text(
        "Concurrency,Inferences/Second,Server Queue,Server Compute Input,Server Compute Infer,"
        "Server Compute Output,p50 latency,p99 latency\n1,900.5,10,20,300,5,640,900\n"
    )
    figures = read_server_latency(csv_path)
    assert figures["server_latency_us"] == 335
    assert figures["server_compute_infer_us"] == 300
    assert (figures["client_p50_latency_us"], figures["throughput_infer_per_s"]) == (640, 900.5)
