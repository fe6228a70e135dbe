"""Ours vs vLLM's own OpenAI server, same engine settings: the same answers.

vLLM's server is started from the same ``model.json`` that ``vllm_model`` reads (the
benchmark runner's :class:`~tritonforge.bench.services.VllmOpenAIService`), so both
run the same engine on the same weights and numerics. The same greedy requests must
then give the same text, the same usage and the same finish reasons, streamed or not:
anything else is a translation difference. A second vLLM engine is expensive here, so
it lives for this module only and the requests are few.
"""

from __future__ import annotations

import openai
import pytest
import tritonclient.grpc as grpcclient

from tritonforge.bench.services import VllmOpenAIService
from tritonforge.launch.launcher import OpenAIFrontend

pytestmark = [pytest.mark.server, pytest.mark.numerics]

MODEL = "vllm_model"
CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Name three colours."},
]
#: (endpoint, body): greedy requests covering chat and completions, a stop string, a
#: length cut, a token-id prompt and vLLM body extras.
REQUESTS = [
    ("chat", {"messages": CHAT, "max_tokens": 32}),
    ("chat", {"messages": CHAT, "max_tokens": 4}),
    ("completion", {"prompt": "The capital of France is", "max_tokens": 24, "stop": ["."]}),
    ("completion", {"prompt": [504, 1488, 3380, 6496, 359], "max_tokens": 8}),
    ("completion", {"prompt": "Once upon a time", "max_tokens": 12, "min_tokens": 12}),
]


@pytest.fixture(scope="module")
def clients(triton_server, tmp_path_factory):
    """(ours, vLLM's) OpenAI clients; vLLM's server is stopped after the module."""
    with grpcclient.InferenceServerClient(triton_server.grpc_url) as triton:
        if not triton.is_model_ready(MODEL):
            pytest.skip(f"{MODEL} is not loaded")
    logs = tmp_path_factory.mktemp("openai-conformance")
    # The same settings as the session's vllm_model (test-numerics serves a copy).
    engine_config = triton_server.repository / MODEL / "1" / "model.json"
    reference = VllmOpenAIService(engine_config, MODEL, logs / "vllm.log")
    ours = OpenAIFrontend.on_free_port(triton_server.grpc_url, log_path=logs / "ours.log")
    reference.start()
    ours.start()
    try:
        reference.wait_ready()
        ours.wait_ready()
        yield (
            openai.OpenAI(base_url=ours.base_url, api_key="-", max_retries=0, timeout=300),
            openai.OpenAI(
                base_url=f"http://127.0.0.1:{reference.port}/v1",
                api_key="-",
                max_retries=0,
                timeout=300,
            ),
        )
    finally:
        ours.stop()
        reference.stop()


def _answer(client: openai.OpenAI, endpoint: str, body: dict, streamed: bool) -> dict:
    body = {"model": MODEL, "temperature": 0, **body}
    extra = {k: body.pop(k) for k in ("min_tokens",) if k in body}
    create = client.chat.completions.create if endpoint == "chat" else client.completions.create
    if not streamed:
        answer = create(**body, extra_body=extra or None)
        choice = answer.choices[0]
        text = choice.message.content if endpoint == "chat" else choice.text
        return {"text": text, "finish": choice.finish_reason, "usage": answer.usage.model_dump()}
    chunks = list(
        create(
            **body, extra_body=extra or None, stream=True, stream_options={"include_usage": True}
        )
    )
    parts, finish = [], None
    for chunk in chunks:
        for choice in chunk.choices:
            parts.append((choice.delta.content if endpoint == "chat" else choice.text) or "")
            finish = choice.finish_reason or finish
    usage = chunks[-1].usage.model_dump()
    return {"text": "".join(parts), "finish": finish, "usage": usage}


def _counts(usage: dict) -> dict:
    return {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_same_text_usage_and_finish_reason_as_vllms_own_server(clients, streamed) -> None:
    ours, theirs = clients
    for endpoint, body in REQUESTS:
        mine = _answer(ours, endpoint, body, streamed)
        reference = _answer(theirs, endpoint, body, streamed)
        where = f"{endpoint} {sorted(body)}"
        assert mine["text"] == reference["text"], where
        assert mine["finish"] == reference["finish"], where
        assert _counts(mine["usage"]) == _counts(reference["usage"]), where
