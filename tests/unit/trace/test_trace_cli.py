"""``python -m tritonforge.trace`` on a recorded export: one streamed chat request through
the OpenAI frontend, Triton (its OpenTelemetry mode) and the runtime, as the e2e
module's receiver stored it (data/streamed_chat.jsonl, OTLP JSON, one export per line)."""

from __future__ import annotations

import base64
import itertools
import json
from pathlib import Path

import pytest

from tritonforge.trace.__main__ import main
from tritonforge.trace.otlp import load
from tritonforge.trace.timeline import pick, render, traces

RECORDED = Path(__file__).parent / "data" / "streamed_chat.jsonl"
REQUEST_ID = "tracing-e2e-d5d8c92a7486"
TRACE_ID = "bcecf471b04e46c7a086ad7e5af8d1ca"
#: Top to bottom, each under the one before: the frontend, then Triton's three.
#: Where a row's (indented) span name starts: after its start and duration columns.
NAME_COLUMN = 22
CHAIN = ["POST /v1/chat/completions", "InferRequest", "synthetic_model", "compute"]


def test_the_timeline_shows_every_layer_under_its_parent(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([str(RECORDED), "--request-id", REQUEST_ID]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"trace {TRACE_ID}  request {REQUEST_ID}")
    names = [line[NAME_COLUMN:].split("  [")[0] for line in lines[2:]]
    indents = {name.strip(): len(name) - len(name.lstrip()) for name in names}
    for parent, child in itertools.pairwise(CHAIN):
        assert indents[child] == indents[parent] + 2, (parent, child)
    # Triton hands the model its span of the model's execution: the runtime's root is there.
    assert indents["tritonforge.request"] == indents["synthetic_model"] + 2
    for name in ("queue", "prefill", "decode", "sends", "response.final"):
        assert indents[f"tritonforge.{name}"] == indents["tritonforge.request"] + 2, name
    request_row = next(line for line in lines if "tritonforge.request " in line)
    assert "model=synthetic_model" in request_row and "finish=length" in request_row
    assert "outcome=finished" in request_row


def test_spans_start_in_order_and_offsets_count_from_the_first() -> None:
    spans = pick(traces(load(RECORDED)), trace_id=TRACE_ID)
    assert spans is not None and len(spans) == 10
    first_row = render(spans).splitlines()[2]
    assert first_row.split()[0] == "0.00" and "POST /v1/chat/completions" in first_row


def test_base64_ids_from_protobufs_json_mapping_read_the_same(tmp_path: Path) -> None:
    hex_file = [json.loads(line) for line in RECORDED.read_text().splitlines()]
    for export in hex_file:
        for resource in export["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if span.get(key):
                            span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    other = tmp_path / "base64.json"
    other.write_text(json.dumps(hex_file))  # one JSON document (a list), not lines
    assert sorted(load(other), key=lambda s: s.span_id) == sorted(
        load(RECORDED), key=lambda s: s.span_id
    )


def test_an_unknown_request_id_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(RECORDED), "--request-id", "nope"]) == 1
    assert "no trace of 'nope'" in capsys.readouterr().err
