"""An OTLP/HTTP traces receiver: the end of the pipe for a test or a benchmark.

Why: a traced server needs somewhere to send its spans. The end-to-end test keeps them
(to check a trace's links) and writes them as OTLP JSON, the file
``python -m tritonforge.trace`` reads; the tracing-cost benchmark only counts them (so a
run shows how many spans a traced server really sent) and keeps the receiver in a
process of its own, off the servers' and the load client's CPU:

    python -m tritonforge.trace.receiver --port 4318 [--file spans.jsonl]

``POST /v1/traces`` takes an ``ExportTraceServiceRequest`` (protobuf or JSON) and
answers 200; ``GET /count`` answers ``{"spans": <received so far>}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tritonforge.trace.otlp import SpanRecord, decode, otlp_json, spans_of

TRACES_PATH = "/v1/traces"
COUNT_PATH = "/count"


class Receiver:
    """OTLP/HTTP on 127.0.0.1 (``port`` 0: a free one), served from a daemon thread.

    ``keep``: hold every span in :attr:`spans`; ``file``: append each export request to
    it as one line of OTLP JSON. Neither: spans are counted and dropped.
    """

    def __init__(self, file: Path | None = None, keep: bool = True, port: int = 0) -> None:
        self.file = file
        self.keep = keep
        self.spans: list[SpanRecord] = []
        self.count = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.take(decode(body, self.headers.get("Content-Type", "")))
                self._answer(b"", "application/x-protobuf")

            def do_GET(self) -> None:
                if self.path != COUNT_PATH:
                    self.send_error(404)
                    return
                with receiver.lock:
                    count = receiver.count
                self._answer(json.dumps({"spans": count}).encode(), "application/json")

            def _answer(self, body: bytes, content_type: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}{TRACES_PATH}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self, export: ExportTraceServiceRequest) -> None:
        """One export request: counted, and kept or written as asked."""
        count = sum(len(s.spans) for r in export.resource_spans for s in r.scope_spans)
        if not (self.keep or self.file):
            with self.lock:
                self.count += count
            return
        as_json = otlp_json(export)
        with self.lock:
            self.count += count
            if self.keep:
                self.spans.extend(spans_of(as_json))
            if self.file is not None:
                with self.file.open("a") as out:
                    out.write(json.dumps(as_json) + "\n")

    def trace(self, trace_id: str) -> list[SpanRecord]:
        """The spans received so far of one trace (``keep`` only)."""
        with self.lock:
            return [span for span in self.spans if span.trace_id == trace_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tritonforge.trace.receiver",
        description="Receive OTLP/HTTP traces on 127.0.0.1: count them, and write them to "
        "a file of OTLP JSON if asked (what python -m tritonforge.trace reads).",
    )
    parser.add_argument("--port", type=int, default=4318)
    parser.add_argument("--file", type=Path, help="append every export request here")
    args = parser.parse_args(argv)
    receiver = Receiver(file=args.file, keep=False, port=args.port)
    print(f"receiving traces at {receiver.url}", flush=True)
    threading.Event().wait()  # until the process is stopped
    return 0


if __name__ == "__main__":
    sys.exit(main())
