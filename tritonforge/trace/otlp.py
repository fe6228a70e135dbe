"""Spans as OTLP carries them: decoded from an export request or its JSON form.

OTLP's JSON encoding (what the OpenTelemetry Collector's file exporter writes, one export
request per line) spells trace and span ids in hex; protobuf's generic JSON mapping
spells those bytes in base64. Both are read, so a file from either source works;
:func:`otlp_json` writes the first.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

#: OTLP status codes.
STATUS_ERROR = 2


@dataclass(frozen=True)
class SpanRecord:
    """One span, as much of it as a timeline needs."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    service: str
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None  # the status message of a span that ended in error

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def _hex_id(value: str) -> str:
    """An id as hex, whichever JSON spelling it came in."""
    if not value:
        return ""
    lowered = value.lower()
    if len(lowered) in (16, 32) and all(c in "0123456789abcdef" for c in lowered):
        return lowered
    try:
        return base64.b64decode(value, validate=True).hex()
    except (binascii.Error, ValueError):
        return value


def _value(any_value: Mapping[str, Any]) -> Any:
    """An OTLP ``AnyValue`` as a plain Python value."""
    if "stringValue" in any_value:
        return any_value["stringValue"]
    if "intValue" in any_value:
        return int(any_value["intValue"])
    if "doubleValue" in any_value:
        return float(any_value["doubleValue"])
    if "boolValue" in any_value:
        return bool(any_value["boolValue"])
    if "arrayValue" in any_value:
        return [_value(v) for v in any_value["arrayValue"].get("values", [])]
    return None


def _attributes(items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    return {item["key"]: _value(item.get("value", {})) for item in items}


def spans_of(export: Mapping[str, Any]) -> Iterator[SpanRecord]:
    """The spans of one export request in its JSON form."""
    for resource_spans in export.get("resourceSpans", []):
        resource = _attributes(resource_spans.get("resource", {}).get("attributes", []))
        service = str(resource.get("service.name", "?"))
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                status = span.get("status", {})
                code = status.get("code", 0)
                failed = code in (STATUS_ERROR, "STATUS_CODE_ERROR")
                yield SpanRecord(
                    trace_id=_hex_id(span.get("traceId", "")),
                    span_id=_hex_id(span.get("spanId", "")),
                    parent_id=_hex_id(span.get("parentSpanId", "")),
                    name=span.get("name", ""),
                    service=service,
                    start_ns=int(span.get("startTimeUnixNano", 0)),
                    end_ns=int(span.get("endTimeUnixNano", 0)),
                    attributes=_attributes(span.get("attributes", [])),
                    error=str(status.get("message", "")) if failed else None,
                )


def otlp_json(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """An export request in OTLP's JSON encoding (ids in hex, as the Collector writes)."""
    data = MessageToDict(request)
    for resource_spans in data.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = _hex_id(span[key])
    return data


def decode(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    """An OTLP/HTTP request body (protobuf, or JSON with ``application/json``)."""
    request = ExportTraceServiceRequest()
    if "json" in content_type:
        from google.protobuf.json_format import Parse

        Parse(body.decode("utf-8"), request)
    else:
        request.ParseFromString(body)
    return request


def load(path: Path) -> list[SpanRecord]:
    """Every span in a file of OTLP JSON: one export request, or one per line."""
    text = path.read_text(encoding="utf-8")
    try:
        documents: list[Any] = [json.loads(text)]
    except json.JSONDecodeError:
        documents = [json.loads(line) for line in text.splitlines() if line.strip()]
    spans: list[SpanRecord] = []
    for document in documents:
        exports = document if isinstance(document, list) else [document]
        for export in exports:
            spans.extend(spans_of(export))
    return spans
