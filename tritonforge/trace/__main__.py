"""``python -m tritonforge.trace FILE``: one request's timeline from an OTLP JSON export.

FILE holds OTLP JSON export requests (the OpenTelemetry Collector's file exporter writes
one per line). Without ``--request-id`` or ``--trace-id`` the latest trace is shown, and
the others are listed by request id so one can be picked.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tritonforge.trace.otlp import load
from tritonforge.trace.timeline import pick, render, request_id_of, traces


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tritonforge.trace",
        description="Print one request's timeline (frontend, Triton, admission, queue, "
        "prefill, decode, sends) from a file of OTLP JSON trace exports.",
    )
    parser.add_argument("file", type=Path, help="OTLP JSON: one export request, or one per line")
    parser.add_argument("--request-id", help="the request's id (X-Request-Id, Triton's id)")
    parser.add_argument("--trace-id", help="the trace's id (32 hex digits)")
    args = parser.parse_args(argv)
    try:
        spans = load(args.file)
    except (OSError, ValueError) as exc:
        parser.error(f"{args.file}: {exc}")
    grouped = traces(spans)
    chosen = pick(grouped, args.request_id, args.trace_id)
    if chosen is None:
        wanted = args.request_id or args.trace_id
        print(f"{args.file}: no trace of {wanted!r} among {len(grouped)}", file=sys.stderr)
        return 1
    print(render(chosen))
    others = [group for group in grouped.values() if group is not chosen]
    if others and args.request_id is None and args.trace_id is None:
        print(f"\n{len(others)} other trace(s); pick one with --request-id or --trace-id:")
        for group in sorted(others, key=lambda g: g[0].start_ns):
            print(f"  {group[0].trace_id}  request {request_id_of(group) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
