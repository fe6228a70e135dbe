"""Shared fixtures: one real tritonserver per test session, on free ports.

Starting a vLLM stub costs ~50 s on two cores, so every end-to-end test shares the
server started here; it loads every model in ``model_repository/`` that can run on
this machine. Tests marked ``last`` (shutdown checks) run after all others.

``TRITONFORGE_TEST_ENGINE_OVERRIDES`` (a JSON object, e.g. ``{"dtype": "float32"}``)
serves a copy of the repository whose vLLM models' engine settings carry those values,
and ``TRITONFORGE_TEST_SYNTHETIC_OVERRIDES`` (e.g. ``{"step_ms": 1}``) does the same for
the synthetic engine's. ``make test-numerics`` reruns the tests marked ``numerics`` and
``speed`` that way — vLLM with other numerics at another speed, the synthetic engine
faster — so a test that hard-codes what the model says or races the engine's speed
fails here, not first on another CPU. The run serves and selects no test of the models
the overrides leave as they are (:data:`NUMERICS_UNTOUCHED_MODELS`): they ran in the
main pass.

Layout, by kind: ``unit/`` needs no server (some need the built C++ tokenizer or a
compiler), ``contract/`` drives adapters against stand-ins of engine APIs that cannot
run here, ``e2e/`` runs against the real tritonserver. Test doubles live in ``fakes.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from tests.servers import serving
from tritonforge.launch.launcher import MODEL_REPOSITORY, TritonServer, available_models
from tritonforge.repo import pbtxt

#: Models the session server leaves out: their tests start a server of their own.
#: vllm_lora_model is a second vLLM engine (LoRA kernels on every request, ~2 GiB);
#: loaded beside vllm_model it would slow every other test on two cores, so
#: tests/e2e/test_lora.py serves the LoRA models on one server of their own;
#: vllm_slo_model (a second vLLM, admission on) is served by tests/e2e/test_slo_admission.py;
#: vllm_embedding_model (vLLM's pooling runner) by tests/e2e/test_embeddings.py.
OWN_SERVER_MODELS = (
    "vllm_lora_model",
    "llamacpp_lora_model",
    "vllm_slo_model",
    "vllm_embedding_model",
)


#: Models the engine overrides leave as they are: ``make test-numerics`` deselects their
#: tests and does not serve them (synthetic_model is served when its overrides are set).
NUMERICS_UNTOUCHED_MODELS = ("llamacpp_model", "tensorrt_llm_model", "synthetic_model")
OVERRIDES_ENV = "TRITONFORGE_TEST_ENGINE_OVERRIDES"
#: The environment variable of each backend's overrides (a JSON object of model.json keys).
OVERRIDES_BY_BACKEND = {
    "vllm": OVERRIDES_ENV,
    "synthetic": "TRITONFORGE_TEST_SYNTHETIC_OVERRIDES",
}


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def pytest_configure(config: pytest.Config) -> None:
    # A CI runner that gives up sends SIGTERM: end the session as Ctrl-C does, so the
    # session fixtures stop their servers (each runs in a session of its own and would
    # outlive a killed pytest). Runs of the benchmark runner keep this handler.
    signal.signal(signal.SIGTERM, _interrupt)


def _untouched_models() -> tuple[str, ...]:
    """The models an overridden run leaves as they are (none without overrides)."""
    if not os.environ.get(OVERRIDES_ENV):
        return ()
    synthetic = bool(os.environ.get(OVERRIDES_BY_BACKEND["synthetic"]))
    return tuple(m for m in NUMERICS_UNTOUCHED_MODELS if not (synthetic and m == "synthetic_model"))


def _untouched(item: pytest.Item) -> bool:
    """Whether the test is parametrized on a model the engine overrides do not change."""
    params = getattr(item, "callspec", None)
    values = params.params.values() if params is not None else ()
    return any(value in _untouched_models() for value in values)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(OVERRIDES_ENV):
        untouched = {item for item in items if _untouched(item)}
        if untouched:
            config.hook.pytest_deselected(items=list(untouched))
            items[:] = [item for item in items if item not in untouched]
    items.sort(key=lambda item: item.get_closest_marker("last") is not None)


@pytest.fixture(scope="session")
def served_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """model_repository/, or a copy with each backend's engine overrides applied; every
    server a test starts serves this one."""
    overrides = {
        backend: json.loads(os.environ[name])
        for backend, name in OVERRIDES_BY_BACKEND.items()
        if os.environ.get(name)
    }
    if not overrides:
        return MODEL_REPOSITORY
    copy = tmp_path_factory.mktemp("repository") / "model_repository"
    shutil.copytree(MODEL_REPOSITORY, copy)  # ensembles are links: copied as folders
    for config in copy.glob("*/config.pbtxt"):
        backend = pbtxt.read(config).backend
        settings_file = config.parent / "1" / "model.json"
        if backend in overrides and settings_file.is_file():
            settings = json.loads(settings_file.read_text()) | overrides[backend]
            settings_file.write_text(json.dumps(settings, indent=2))
    return copy


@pytest.fixture(scope="session")
def triton_server(
    tmp_path_factory: pytest.TempPathFactory, served_repository: Path
) -> TritonServer:
    """The real server with all runnable models loaded; its log is kept on failure."""
    attach = os.environ.get("TRITONFORGE_TEST_ATTACH")  # "http,grpc,metrics" of a running server
    if attach:
        http, grpc, metrics = (int(p) for p in attach.split(","))
        yield TritonServer(http_port=http, grpc_port=grpc, metrics_port=metrics)
        return
    log = Path(
        os.environ.get("TRITONFORGE_TEST_LOG", tmp_path_factory.mktemp("triton") / "server.log")
    )
    only = os.environ.get("TRITONFORGE_TEST_MODELS")  # comma-separated subset, for development
    # TRITONFORGE_TEST_SERVER_ARGS: extra tritonserver flags, e.g. "--log-verbose=1"
    repository = served_repository
    left_out = OWN_SERVER_MODELS + _untouched_models()
    models = (
        only.split(",") if only else [m for m in available_models(repository) if m not in left_out]
    )
    server = TritonServer.on_free_ports(
        repository=repository,
        log_path=log,
        models=models,
        extra_args=os.environ.get("TRITONFORGE_TEST_SERVER_ARGS", "").split(),
    )
    with serving(server, "tritonserver did not become ready"):
        yield server


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    """The tokenizer parity corpus (>= 10,000 strings): module and served-model tests."""
    # Imported here, not at the top: it needs the built C++ tokenizer, most tests do not.
    from tests.tokenizers_under_test import parity_corpus

    return parity_corpus()
