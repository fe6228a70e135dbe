# tritonforge: two commands matter — `make serve` and `make test` (see README.md).
VENV   := .venv
PY     := $(VENV)/bin/python
ARGS   ?=
PYTEST_ARGS ?=
CONTRACT ?= perf/contracts/smoke.yaml
MINUTES ?= 5
CONCURRENCY ?= 64
SOAK_MODELS ?= vllm_model ensemble_vllm
CANCELS ?= 5000
STORM_MODELS ?= vllm_model ensemble_vllm guarded_chat

.PHONY: serve test test-numerics setup bench-venv bench soak storm crash-storm lint format

setup:
	@scripts/bootstrap.sh

## Run the real tritonserver on model_repository/ (127.0.0.1: HTTP 8000, gRPC 8001,
## metrics 8002; TRITON_HTTP_PORT / TRITON_GRPC_PORT / TRITON_METRICS_PORT override).
## Extra tritonserver flags: make serve ARGS="--log-verbose=1"
serve: setup
	@exec $(PY) -m tritonforge.launch.launcher -- $(ARGS)

## The benchmark tools' own venv (genai-perf, aiperf, perf_analyzer), apart from .venv.
bench-venv:
	@scripts/setup_bench_venv.sh

## The whole suite against the real server and model (the perf smoke test needs bench-venv).
test: setup bench-venv
	$(PY) -m pytest $(PYTEST_ARGS)

## The tests whose expectations come from the model's text (marked numerics) or whose
## premise is an order, overlap or queue built by construction (marked speed), again with
## vLLM in the dtype this host does not serve it with (float32 where bfloat16 is native,
## else bfloat16: other kernels, other greedy text, another speed) and the synthetic
## engine stepping every millisecond: a test that hard-codes what the model says or races
## the engine's speed fails here, not first on another CPU.
test-numerics: setup
	TRITONFORGE_TEST_ENGINE_OVERRIDES="$$($(PY) -m tritonforge.engines.host_settings)" \
	TRITONFORGE_TEST_SYNTHETIC_OVERRIDES='{"step_ms": 1}' \
	$(PY) -m pytest -m "numerics or speed" $(PYTEST_ARGS)

## Run an evaluation contract end to end, any kind (docs/benchmarking.md):
## make bench CONTRACT=perf/contracts/chat-mix.yaml, or CONTRACT=perf/contracts/serving-ceiling.yaml
bench: setup bench-venv
	$(PY) -m tritonforge.bench run --contract $(CONTRACT)

## The reliability suite at full size, on a server of its own (not part of `make test`):
## MINUTES of mixed load at CONCURRENCY over SOAK_MODELS (RSS growth < 5 %), 100 streams
## cancelled at once, 200 malformed requests, SIGTERM under load. Writes
## perf/results/reliability/<UTC time>/. Example: make soak MINUTES=3 CONCURRENCY=64
soak: setup
	$(PY) -m tritonforge.bench soak --minutes $(MINUTES) --concurrency $(CONCURRENCY) --models $(SOAK_MODELS)

## The storm with a forced kill, on a launcher of its own (not part of `make test`): 10
## minutes at concurrency 128 over vllm_model, ensemble_vllm and the OpenAI API, 20 % of
## requests cancelled, 5 % malformed, tritonserver SIGKILLed midway; every request must
## end within its timeout_s, the server serve again by itself (README.md, "Reliability").
## Writes perf/results/reliability/<UTC time>/. Example: make storm ARGS="--minutes 3"
storm: setup
	$(PY) -m tritonforge.bench storm $(ARGS)

## tritonserver crashes per 1,000 cancelled requests, by when the cancel comes (README.md,
## "Reliability"), on a server of its own; not part of `make test`. Writes
## perf/results/crash-storm/<UTC time>/. Example: make crash-storm CANCELS=1000
crash-storm: setup
	$(PY) -m tritonforge.bench.reliability.crash_storm --cancels $(CANCELS) --models $(STORM_MODELS)

## ruff, then mypy (pyproject.toml: strict except on the tools: bench/, launch/, repo/).
lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy

format:
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .
