"""The serving-ceiling contract's pieces without a server: validation, counting, figures."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
from tritonclient.grpc import service_pb2

from tritonforge.bench import ceiling
from tritonforge.bench.ab import overlay_venv, schedule
from tritonforge.bench.ceiling import (
    assemble_repository,
    load_ceiling_contract,
    summarize,
)
from tritonforge.bench.contract import ContractError
from tritonforge.bench.environment import imported_tree
from tritonforge.bench.run_plan import rotated
from tritonforge.bench.stream_clients import (
    Client,
    StreamRecord,
    Worker,
    grpc_request,
    response_tokens,
)

CONTRACT = Path(__file__).resolve().parents[3] / "perf" / "contracts" / "serving-ceiling.yaml"


def test_the_shipped_contract_is_valid_and_overrides_apply() -> None:
    contract = load_ceiling_contract(CONTRACT, ["load.rounds=1", "load.concurrency=[1, 4]"])
    assert contract.load.rounds == 1 and contract.load.concurrency == [1, 4]
    assert contract.baseline == "floor"
    assert {t.protocol for t in contract.targets} == {
        "grpc",
        "http",
        "openai_chat",
        "openai_completions",
    }


def test_a_target_on_an_unserved_model_is_refused_naming_it() -> None:
    with pytest.raises(ContractError, match="target floor: model 'nope' is not in models"):
        load_ceiling_contract(CONTRACT, ["targets.0.model=nope"])
    with pytest.raises(ContractError, match=r"load\.output_tokens"):
        load_ceiling_contract(CONTRACT, ["load.output_tokens=0"])


def test_the_run_repository_copies_and_repoints_models(tmp_path: Path) -> None:
    contract = load_ceiling_contract(CONTRACT)
    repository = assemble_repository(contract.models, tmp_path / "repo")
    ensemble = (repository / "ensemble_synthetic" / "config.pbtxt").read_text()
    assert 'model_name: "synthetic_unpaced"' in ensemble and "vllm_model" not in ensemble
    settings = (repository / "synthetic_unpaced" / "1" / "model.json").read_text()
    assert '"step_ms": 0' in settings and '"tokenizer"' in settings


def test_num_output_tokens_is_read_from_raw_and_typed_contents() -> None:
    raw = service_pb2.ModelInferResponse()
    raw.outputs.add(name="text_output")
    raw.outputs.add(name="num_output_tokens")
    raw.raw_output_contents.extend([b"\x03\x00\x00\x00abc", (3).to_bytes(4, "little")])
    assert response_tokens(raw) == 3
    typed = service_pb2.ModelInferResponse()
    typed.outputs.add(name="num_output_tokens").contents.uint_contents.extend([2])
    assert response_tokens(typed) == 2
    assert response_tokens(service_pb2.ModelInferResponse()) == 0


def test_the_grpc_request_asks_for_counts_and_an_empty_final() -> None:
    request = grpc_request("m", "hi", 7)
    names = [i.name for i in request.inputs]
    assert names == ["text_input", "sampling_parameters", "stream", "return_num_output_tokens"]
    assert request.parameters["triton_enable_empty_final_response"].bool_param
    assert request.inputs[1].contents.bytes_contents[0] == b'{"max_tokens": 7}'


def test_a_levels_figures() -> None:
    a = StreamRecord(start=0.0, end=1.0, arrivals=[0.1, 0.2, 0.4], tokens=4)
    b = StreamRecord(start=0.5, end=2.0, arrivals=[0.7], tokens=1)
    failed = StreamRecord(start=0.6, end=0.7, error="boom")
    figures = summarize([a, b, failed], {"tritonserver": 0.5, "client": 0.25})
    assert figures["tokens"] == 5 and figures["responses"] == 4 and figures["errors"] == 1
    assert figures["tokens_per_s"] == pytest.approx(2.5)
    assert figures["tokens_per_response"] == pytest.approx(1.25)
    assert figures["server_cpu_us_per_token"] == pytest.approx(100_000)
    assert figures["cpu_us_per_token"]["client"] == pytest.approx(50_000)
    assert figures["ttft_ms"]["p50"] == pytest.approx(150)  # between the two TTFTs, 100 and 200


def test_a_streams_pace_leaves_out_the_wait_for_its_first_response() -> None:
    """3 tokens in 0.3 s after a first response of 2: 10 tokens/s, however late it came."""
    late = StreamRecord(start=0.0, end=5.0, arrivals=[4.6, 4.7, 4.9], tokens=5, first_tokens=2)
    assert late.decode_rate == pytest.approx(10)
    assert StreamRecord(start=0.0, arrivals=[0.1], tokens=1).decode_rate is None
    figures = summarize([late], {"tritonserver": 0.1})
    assert figures["stream_tokens_per_s"]["p50"] == pytest.approx(10)


def test_a_record_remembers_what_its_first_response_carried() -> None:
    record = StreamRecord(start=0.0)
    record.arrived(3)
    record.arrived(1)
    assert record.first_tokens == 3 and len(record.arrivals) == 2
    assert record.arrivals[0] <= record.arrivals[1]


def test_rotation() -> None:
    contract = load_ceiling_contract(CONTRACT)
    names = [t.name for t in rotated(contract.targets, 1)]
    assert names[0] == contract.targets[1].name and names[-1] == contract.targets[0].name


def test_a_stream_that_never_ends_is_an_error_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    class Silent(Worker):
        async def send(self, prompt: str, max_tokens: int, record: StreamRecord) -> None:
            record.arrivals.append(record.start)
            record.tokens += 1
            await asyncio.sleep(3600)  # a server that never sends the end of the stream

        async def close(self) -> None:
            pass

    class SilentClient(Client):
        async def open(self) -> None: ...

        async def close(self) -> None: ...

        def worker(self) -> Worker:
            return Silent()

    monkeypatch.setattr(
        ceiling, "make_client", lambda protocol, url, model: SilentClient(url, model)
    )
    load = load_ceiling_contract(CONTRACT, ["load.request_timeout_s=0.05"]).load
    records = asyncio.run(ceiling.drive("grpc", "x", "m", load, concurrency=2, count=3))
    assert len(records) == 3
    assert all(r.error == "no end of stream within 0.05 s (1 tokens had arrived)" for r in records)


def test_ab_runs_every_commit_once_a_round_in_rotated_order() -> None:
    assert schedule(["a", "b"], 3) == [(0, "a"), (0, "b"), (1, "b"), (1, "a"), (2, "a"), (2, "b")]


def test_ab_serves_a_commit_from_its_own_tree(tmp_path: Path) -> None:
    """The venv a commit runs in imports that commit's tritonforge — asked the way
    Triton's stubs import it — and this venv's packages beside it."""
    tree = tmp_path / "tree"
    (tree / "tritonforge").mkdir(parents=True)
    (tree / "tritonforge" / "__init__.py").write_text("")
    python = overlay_venv(tmp_path / "venv", tree)
    assert imported_tree(python) == tree.resolve()
    done = subprocess.run(
        [str(python), "-I", "-c", "import numpy, opentelemetry.proto"], check=False
    )
    assert done.returncode == 0
