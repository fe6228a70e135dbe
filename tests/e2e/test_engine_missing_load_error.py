"""tensorrt_llm_model where TensorRT-LLM is missing: a clear load error, never a crash.

The launcher leaves the model out here (its requires.txt names tensorrt_llm). Loading
it by hand through the model-control API must fail with a message that says what is
missing and where it runs, and the server must go on serving the other models.

Triton 2.51 keeps a model whose load failed in the UNAVAILABLE state, and with strict
readiness (the default) ``/v2/health/ready`` then answers 400 until restart, even after
an unload. So this runs with the ``last`` tests, before the lifecycle tests that stop
the session server (its file name sorts first), and checks liveness and real
inference instead of readiness. Triton 2.51 workaround W11, see docs/triton-2.51-workarounds.md.
"""

from __future__ import annotations

import importlib.util

import pytest
import requests

from tests.e2e.client import generate

MODEL = "tensorrt_llm_model"

pytestmark = [
    pytest.mark.server,
    pytest.mark.last,
    pytest.mark.skipif(
        importlib.util.find_spec("tensorrt_llm") is not None,
        reason="TensorRT-LLM is installed: the model loads for real (docker/run_gpu_tests.sh)",
    ),
]


def test_loading_without_tensorrt_llm_fails_clearly_and_the_server_keeps_serving(
    triton_server,
) -> None:
    base = f"http://{triton_server.http_url}/v2"
    reply = requests.post(f"{base}/repository/models/{MODEL}/load", timeout=300)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert "tensorrt_llm_model needs TensorRT-LLM, which is not importable here" in error
    assert "trtllm-python-py3" in error  # says where it does run
    assert requests.get(f"{base}/models/{MODEL}/ready", timeout=10).status_code != 200
    assert requests.get(f"{base}/health/live", timeout=10).status_code == 200
    index = requests.post(f"{base}/repository/index", json={}, timeout=10).json()
    states = {m["name"]: m.get("state") for m in index}
    assert states[MODEL] == "UNAVAILABLE"
    serving = [name for name in ("vllm_model", "llamacpp_model") if states.get(name) == "READY"]
    assert serving
    for model in serving:
        body = {"text_input": "Hi", "parameters": {"max_tokens": 2}}
        assert "text_output" in generate(triton_server.http_url, model, body)
    assert requests.post(f"{base}/repository/models/{MODEL}/unload", timeout=60).ok
