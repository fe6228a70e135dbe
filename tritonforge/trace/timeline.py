"""One request's spans as a timeline: where its time went, layer by layer.

Spans are grouped by trace; a trace is picked by a request id (any span's
``tritonforge.request_id``) or a trace id, else the latest one. Each span is a row
indented under its parent, with its start relative to the trace's first span, its
duration, its service and the attributes that explain it (admission decision, tokens,
time to first token, sends, errors).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from tritonforge.trace.otlp import SpanRecord

#: Attributes shown beside a span, in this order, with a short label.
SHOWN = (
    ("gen_ai.request.model", "model"),
    ("tritonforge.admission.decision", "admission"),
    ("tritonforge.admission.predicted_ttft_ms", "predicted ttft ms"),
    ("gen_ai.usage.input_tokens", "in"),
    ("gen_ai.usage.output_tokens", "out"),
    ("gen_ai.server.time_to_first_token", "ttft s"),
    ("gen_ai.response.finish_reasons", "finish"),
    ("tritonforge.sends.count", "sends"),
    ("tritonforge.sends.busy_ms", "busy ms"),
    ("http.response.status_code", "status"),
    ("tritonforge.outcome", "outcome"),
)


def request_id_of(spans: Iterable[SpanRecord]) -> str | None:
    """The request id a trace's spans carry (the first found)."""
    for span in spans:
        value = span.attributes.get("tritonforge.request_id")
        if isinstance(value, str):
            return value
    return None


def carries(spans: Iterable[SpanRecord], request_id: str) -> bool:
    """Whether a trace is the request's: a span names its id, or an inner request's id made
    from it (guarded_chat's ``<id>/guarded_chat-…``)."""
    for span in spans:
        value = span.attributes.get("tritonforge.request_id")
        if isinstance(value, str) and (value == request_id or value.startswith(f"{request_id}/")):
            return True
    return False


def traces(spans: Iterable[SpanRecord]) -> dict[str, list[SpanRecord]]:
    """Spans by trace id, each trace's spans by start time."""
    grouped: dict[str, list[SpanRecord]] = defaultdict(list)
    for span in spans:
        grouped[span.trace_id].append(span)
    return {
        trace_id: sorted(group, key=lambda s: s.start_ns) for trace_id, group in grouped.items()
    }


def pick(
    grouped: dict[str, list[SpanRecord]], request_id: str | None = None, trace_id: str | None = None
) -> list[SpanRecord] | None:
    """The trace of ``request_id`` or ``trace_id``; with neither, the one that began last."""
    if trace_id is not None:
        return grouped.get(trace_id.lower())
    if request_id is not None:
        found = [group for group in grouped.values() if carries(group, request_id)]
        return found[-1] if found else None
    if not grouped:
        return None
    return max(grouped.values(), key=lambda group: group[0].start_ns)


def _shown(span: SpanRecord) -> str:
    parts = []
    for key, label in SHOWN:
        value = span.attributes.get(key)
        if value is None:
            continue
        if isinstance(value, float):
            value = f"{value:.3g}"
        elif isinstance(value, list):
            value = ",".join(map(str, value))
        parts.append(f"{label}={value}")
    if span.error is not None:
        parts.append(f"ERROR: {span.error}" if span.error else "ERROR")
    return " ".join(parts)


def _ordered(spans: Sequence[SpanRecord]) -> list[tuple[int, SpanRecord]]:
    """Spans depth-first under their parents (depth, span); orphans start a tree."""
    ids = {span.span_id for span in spans}
    children: dict[str, list[SpanRecord]] = defaultdict(list)
    roots = []
    for span in spans:
        if span.parent_id and span.parent_id in ids:
            children[span.parent_id].append(span)
        else:
            roots.append(span)
    rows: list[tuple[int, SpanRecord]] = []

    def walk(span: SpanRecord, depth: int) -> None:
        rows.append((depth, span))
        for child in sorted(children[span.span_id], key=lambda s: s.start_ns):
            walk(child, depth + 1)

    for root in roots:
        walk(root, 0)
    return rows


def render(spans: Sequence[SpanRecord]) -> str:
    """A trace's timeline as text (spans of one trace, any order)."""
    if not spans:
        return "no spans"
    origin = min(span.start_ns for span in spans)
    end = max(span.end_ns for span in spans)
    services = sorted({span.service for span in spans})
    request_id = request_id_of(spans) or "-"
    lines = [
        f"trace {spans[0].trace_id}  request {request_id}  "
        f"{len(spans)} spans from {', '.join(services)}  {(end - origin) / 1e6:.1f} ms",
        f"{'start ms':>10} {'ms':>9}  span",
    ]
    width = max(2 * depth + len(span.name) for depth, span in _ordered(spans))
    for depth, span in _ordered(spans):
        name = f"{'  ' * depth}{span.name}"
        lines.append(
            f"{(span.start_ns - origin) / 1e6:>10.2f} {span.duration_ms:>9.2f}  "
            f"{name:<{width}}  [{span.service}] {_shown(span)}".rstrip()
        )
    return "\n".join(lines)
