"""``python -m tritonforge.openai --triton-grpc HOST:PORT``: serve the OpenAI API with uvicorn.

Binds 127.0.0.1 unless told otherwise, like every server of this project. The access
log is off by default: request paths are harmless, but a server that answers
thousands of streamed requests a minute should not spend its time writing them.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys

import uvicorn

from tritonforge.openai.app import DEFAULT_CHAT_MAX_TOKENS, create_app
from tritonforge.openai.carry_over import DEFAULT_MAX_WAIT_S, DEFAULT_MAX_WAITING, CarryOverSettings
from tritonforge.openai.shutdown import (
    DEFAULT_SHUTDOWN_GRACE_S,
    FLUSH_S,
    GracefulServer,
    shutting_down,
)
from tritonforge.serving.tracing import ENDPOINT_ENV, SAMPLING_ENV, parse_sampling


def default_metrics_url(triton_grpc: str) -> str:
    """Triton's metrics beside its gRPC endpoint, on the port the launcher gives them."""
    host = triton_grpc.rsplit(":", 1)[0]
    return f"http://{host}:{os.environ.get('TRITON_METRICS_PORT', '8002')}/metrics"


def _log_requests(level: str) -> None:
    """Print the frontend's own lines (with ``TRITONFORGE_LOG_REQUESTS``, a line per
    request: its id, status and trace) as uvicorn prints its own."""
    logger = logging.getLogger("tritonforge.openai")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level.upper())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tritonforge.openai",
        description="OpenAI-compatible API in front of the LLM models of a Triton server.",
    )
    parser.add_argument(
        "--triton-grpc",
        default=os.environ.get("TRITONFORGE_TRITON_GRPC", "127.0.0.1:8001"),
        help="Triton's gRPC endpoint, HOST:PORT (default 127.0.0.1:8001)",
    )
    parser.add_argument(
        "--triton-metrics",
        default=None,
        help="Triton's metrics URL, served again on /metrics (default: the gRPC endpoint's "
        "host, port $TRITON_METRICS_PORT or 8002, path /metrics)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=9000, help="port (default 9000)")
    parser.add_argument(
        "--default-max-tokens",
        type=int,
        default=DEFAULT_CHAT_MAX_TOKENS,
        help="max_tokens of a chat request that sends none, lowered to what fits the "
        f"model's context (default {DEFAULT_CHAT_MAX_TOKENS}; 0: the model's own default, 16)",
    )
    parser.add_argument(
        "--restart-wait",
        type=float,
        default=DEFAULT_MAX_WAIT_S,
        help="seconds a request without timeout_s waits for a restarted tritonserver, from "
        f"its arrival (default {DEFAULT_MAX_WAIT_S:g}; with timeout_s, that deadline)",
    )
    parser.add_argument(
        "--max-waiting",
        type=int,
        default=DEFAULT_MAX_WAITING,
        help="requests that may wait for a restarted tritonserver at once; past it 503 "
        f"with Retry-After (default {DEFAULT_MAX_WAITING})",
    )
    parser.add_argument(
        "--shutdown-grace-s",
        type=float,
        default=DEFAULT_SHUTDOWN_GRACE_S,
        help="seconds requests in flight may run on after SIGTERM or Ctrl-C (new connections "
        "are refused at once); those still running then end with an error event or a 503 "
        f"(default {DEFAULT_SHUTDOWN_GRACE_S})",
    )
    parser.add_argument("--access-log", action="store_true", help="log each request's path")
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--otlp-endpoint",
        default=None,
        help="OpenTelemetry: send traces of requests to this OTLP/HTTP traces URL "
        f"(e.g. http://127.0.0.1:4318/v1/traces; default ${ENDPOINT_ENV}, else "
        "$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; unset: tracing is off)",
    )
    parser.add_argument(
        "--trace-sampling",
        default=None,
        help="share of requests without a sampled traceparent that are traced, 0 to 1 "
        f"(default ${SAMPLING_ENV}, else 1)",
    )
    args = parser.parse_args(argv)
    if args.restart_wait <= 0 or args.max_waiting < 1:
        parser.error("--restart-wait must be > 0 and --max-waiting >= 1")
    if args.shutdown_grace_s < 0:
        parser.error("--shutdown-grace-s must be >= 0")
    # The flags win over the environment, which the tracer reads (as Triton's stubs do).
    if args.otlp_endpoint is not None:
        os.environ[ENDPOINT_ENV] = args.otlp_endpoint
    if args.trace_sampling is not None:
        try:
            parse_sampling(args.trace_sampling, "--trace-sampling")
        except ValueError as exc:
            parser.error(str(exc))
        os.environ[SAMPLING_ENV] = args.trace_sampling
    _log_requests(args.log_level)
    metrics = args.triton_metrics or default_metrics_url(args.triton_grpc)
    carry = CarryOverSettings(max_waiting=args.max_waiting, max_wait_s=args.restart_wait)
    app = create_app(
        args.triton_grpc,
        args.default_max_tokens or None,
        triton_metrics=metrics,
        carry_over_settings=carry,
    )
    grace = args.shutdown_grace_s
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        access_log=args.access_log,
        log_level=args.log_level,
        timeout_graceful_shutdown=math.ceil(grace + FLUSH_S),
    )
    gateway = app.state.server.gateway
    GracefulServer(config, grace, lambda: gateway.end_streams(shutting_down(grace))).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
