"""The OTLP/HTTP receiver takes what the SDK's own exporter sends."""

from __future__ import annotations

from pathlib import Path

import requests
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tritonforge.trace.otlp import load
from tritonforge.trace.receiver import COUNT_PATH, Receiver


def send_spans(url: str, names: list[str]) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=url)))
    tracer = provider.get_tracer("test")
    for name in names:
        tracer.start_span(name).end()
    provider.shutdown()


def test_spans_are_counted_and_dropped_or_kept_and_written(tmp_path: Path) -> None:
    counting = Receiver(keep=False)
    keeping = Receiver(file=tmp_path / "spans.jsonl")
    try:
        send_spans(counting.url, ["a", "b", "c"])
        send_spans(keeping.url, ["d", "e"])
        count_url = f"http://127.0.0.1:{counting.port}{COUNT_PATH}"
        assert requests.get(count_url, timeout=5).json() == {"spans": 3}
        assert counting.spans == [] and counting.count == 3
        assert [s.name for s in keeping.spans] == ["d", "e"]
        assert [s.name for s in load(tmp_path / "spans.jsonl")] == ["d", "e"]
    finally:
        counting.close()
        keeping.close()
