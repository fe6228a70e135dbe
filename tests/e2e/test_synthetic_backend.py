"""synthetic_model end to end: the real tritonserver, the synthetic engine, SmolLM2's tokenizer.

The expected text comes from the same engine run in the test process with the shipped
settings: a seeded request must come back the same over gRPC (streamed or not) and
over HTTP, token for token.
"""

from __future__ import annotations

import asyncio
import json
import os

import numpy as np
import pytest

from tests.e2e.client import (
    generate,
    generate_stream_text,
    llm_inputs,
    metric,
    model_ready,
    stream,
    wait_for,
)
from tritonforge.engines.config import load_engine_config
from tritonforge.engines.synthetic import SyntheticEngine
from tritonforge.launch.launcher import MODEL_REPOSITORY, server_environment
from tritonforge.serving.schema import parse_request

MODEL = "synthetic_model"
SAMPLING = {"seed": 5, "max_tokens": 40, "ignore_eos": True}
PROMPT = "Write a sentence about rivers."

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server(triton_server):
    if not model_ready(triton_server, MODEL):
        pytest.skip(f"{MODEL} is not loaded")
    return triton_server


@pytest.fixture(scope="module")
def offline() -> tuple[str, list[int]]:
    """The answer to PROMPT/SAMPLING from the engine itself, outside the server."""
    version = MODEL_REPOSITORY / MODEL / "1"
    env = server_environment({**os.environ})
    settings = load_engine_config(version, "model.json")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITONFORGE_MODELS", env["TRITONFORGE_MODELS"])
        engine = SyntheticEngine.from_config(settings | {"step_ms": 0}, version)
    request = parse_request(
        {
            "text_input": np.array([PROMPT.encode()], dtype=np.object_),
            "sampling_parameters": np.array([json.dumps(SAMPLING).encode()], dtype=np.object_),
        }
    )

    async def run() -> tuple[str, list[int]]:
        await engine.start()
        try:
            prepared = engine.prepare(request)
            outputs = [o async for o in engine.generate("x", prepared, request.sampling)]
        finally:
            await engine.shutdown()
        return "".join(o.text for o in outputs), [t for o in outputs for t in o.token_ids]

    return asyncio.run(run())


def test_streamed_and_whole_answers_are_the_engines(server, offline) -> None:
    text, ids = offline
    flags = {"return_output_ids": True, "return_num_output_tokens": True}
    streamed = stream(server.grpc_url, MODEL, llm_inputs(PROMPT, SAMPLING, **flags))
    assert streamed.error is None
    assert streamed.text == text
    assert [int(t) for r in streamed.outputs("output_ids") for t in r] == ids
    assert sum(int(n[0]) for n in streamed.outputs("num_output_tokens")) == len(ids) == 40
    whole = stream(server.grpc_url, MODEL, llm_inputs(PROMPT, SAMPLING, stream=False))
    assert whole.text == text and len(whole.responses) == 1
    http = generate_stream_text(
        server.http_url, MODEL, {"text_input": PROMPT, "stream": True, "parameters": SAMPLING}
    )
    assert http == text


def test_chat_and_stop_strings(server, offline) -> None:
    text, _ = offline
    stop = text[10:14]
    body = {
        "text_input": PROMPT,
        "sampling_parameters": json.dumps({**SAMPLING, "stop": [stop]}),
        "exclude_input_in_output": True,
        "return_finish_reason": True,
    }
    answer = generate(server.http_url, MODEL, body)
    assert answer["text_output"] == text[: text.index(stop)]
    assert answer["finish_reason"] == "stop"
    chat = stream(
        server.grpc_url,
        MODEL,
        llm_inputs(messages=[{"role": "user", "content": "Hi"}], sampling={"max_tokens": 8}),
    )
    assert chat.error is None and chat.responses


@pytest.mark.speed
def test_cancel_and_metrics(server) -> None:
    labels = {"model": MODEL}
    cancelled_before = metric(
        server.metrics_url, "vllm:request_outcome_total", **labels, outcome="cancelled"
    )
    tokens_before = metric(server.metrics_url, "vllm:generation_tokens_total", **labels)
    long = {"max_tokens": 1500, "ignore_eos": True}
    partial = stream(server.grpc_url, MODEL, llm_inputs(PROMPT, long), stop_after=3)
    assert len(partial.responses) == 3
    wait_for(
        lambda: (
            metric(server.metrics_url, "vllm:request_outcome_total", **labels, outcome="cancelled")
            > cancelled_before
        ),
        timeout_s=20,
        what="the cancelled request to be counted",
    )
    assert (
        3
        <= metric(server.metrics_url, "vllm:generation_tokens_total", **labels) - tokens_before
        < 1500
    )


def test_structured_output_is_refused_naming_the_field(server) -> None:
    sampling = {"max_tokens": 4, "structured_outputs": {"regex": "[a-z]+"}}
    answer = stream(server.grpc_url, MODEL, llm_inputs(PROMPT, sampling))
    assert answer.error is not None
    assert "sampling_parameters.structured_outputs" in str(answer.error)
