"""guard and guarded_chat on the session's real server (real vllm_model behind it)."""

from __future__ import annotations

import json
import time

import pytest
import requests
import tritonclient.grpc as grpcclient

from tests.e2e.client import (
    LONG_GREEDY,
    Hold,
    bool_input,
    bytes_input,
    control_model,
    llm_inputs,
    model_state,
    requests_cancelled,
    requests_running,
    stream,
    wait_for,
)
from tritonforge.pipelines.guard import redact

pytestmark = pytest.mark.server

GREEDY = {"temperature": 0, "max_tokens": 48}
PHONE_PROMPT = "An example phone number in the US is"
# The output guard works on real model output, but which digits (and whether a number
# at all) a greedy 135M model prints depends on the CPU's bf16 kernels: a structured
# output makes the engine write a US number, its digits still chosen by the model.
PHONE_ANSWER = {
    **GREEDY,
    "structured_outputs": {"regex": "Call me at [0-9]{3}-[0-9]{3}-[0-9]{4}, please\\."},
}


@pytest.fixture(scope="module")
def server(triton_server):
    return triton_server


def _chat(prompt: str, sampling: dict, stream_: bool = True) -> list[grpcclient.InferInput]:
    return [
        bytes_input("text_input", prompt),
        bytes_input("sampling_parameters", json.dumps(sampling)),
        bool_input("stream", stream_),
    ]


def _ready(server, model: str) -> bool:
    url = f"http://{server.http_url}/v2/models/{model}/ready"
    return requests.get(url, timeout=10).status_code == 200


# --- guard --------------------------------------------------------------------------


def test_guard_model_redacts_and_lists_findings(server) -> None:
    text = "Card 4111 1111 1111 1111, mail jo@example.com, IBAN GB82 WEST 1234 5698 7654 32."
    reply = requests.post(
        f"http://{server.http_url}/v2/models/guard/generate", json={"text_input": text}, timeout=30
    ).json()
    assert reply["text_output"] == "Card [CARD], mail [EMAIL], IBAN [IBAN]."
    assert [f["type"] for f in json.loads(reply["findings"])] == ["card", "email", "iban"]


def test_guard_model_rejects_invalid_utf8_and_stays_ready(server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(Exception, match="text_input: is not valid UTF-8"):
        client.infer("guard", [bytes_input("text_input", b"ok \xff")])
    assert _ready(server, "guard")


# --- guarded_chat: redaction ----------------------------------------------------------


@pytest.mark.numerics
def test_prompt_secrets_never_reach_the_llm_and_are_reported(server) -> None:
    prompt = "My email is jo@example.com and my card 4111 1111 1111 1111. Say hi."
    result = stream(server.grpc_url, "guarded_chat", _chat(prompt, GREEDY))
    assert result.error is None, result.error
    findings = json.loads(result.texts("input_findings")[0])
    assert [f["type"] for f in findings] == ["email", "card"]
    # The LLM saw the redacted prompt: same greedy answer as vllm_model on it.
    redacted, _ = redact(prompt)
    direct = stream(server.grpc_url, "vllm_model", llm_inputs(redacted, GREEDY))
    assert result.text == redact(direct.text)[0]


@pytest.mark.numerics
def test_output_secrets_are_redacted_while_streaming(server) -> None:
    direct = stream(server.grpc_url, "vllm_model", llm_inputs(PHONE_PROMPT, PHONE_ANSWER))
    expected, findings = redact(direct.text)
    assert [f.type for f in findings] == ["phone"], direct.text
    result = stream(server.grpc_url, "guarded_chat", _chat(PHONE_PROMPT, PHONE_ANSWER))
    assert result.error is None, result.error
    assert len(result.responses) > 1
    assert result.text == expected
    reported = [f for part in result.texts("output_findings") for f in json.loads(part)]
    assert reported == [{"type": f.type, "start": f.start, "end": f.end} for f in findings]


@pytest.mark.numerics
def test_non_streamed_chat_answers_once(server) -> None:
    inputs = [
        *_chat(PHONE_PROMPT, PHONE_ANSWER, False),
        bool_input("exclude_input_in_output", True),
    ]
    result = stream(server.grpc_url, "guarded_chat", inputs)
    assert result.error is None, result.error
    assert len(result.responses) == 1
    assert result.text == "Call me at [PHONE], please.", result.text


@pytest.mark.numerics
def test_takes_the_whole_schema_echo_counts_and_finish_reason(server) -> None:
    # As every LLM model: a non-streamed text prompt is echoed unless excluded, and the
    # return_* flags bring the inner model's counts (they add up to vllm_model's own).
    flags = {
        f"return_{n}": True for n in ("finish_reason", "num_input_tokens", "num_output_tokens")
    }
    sampling = {**PHONE_ANSWER, "max_tokens": 8}
    direct = stream(server.grpc_url, "vllm_model", llm_inputs(PHONE_PROMPT, sampling, **flags))
    assert direct.error is None, direct.error
    expected_out = int(sum(a.sum() for a in direct.outputs("num_output_tokens")))
    expected_in = int(direct.outputs("num_input_tokens")[0][0])
    flag_inputs = [bool_input(name, True) for name in flags]

    streamed = stream(server.grpc_url, "guarded_chat", _chat(PHONE_PROMPT, sampling) + flag_inputs)
    assert streamed.error is None, streamed.error
    assert int(sum(a.sum() for a in streamed.outputs("num_output_tokens"))) == expected_out
    assert {int(a[0]) for a in streamed.outputs("num_input_tokens")} == {expected_in}
    reasons = [b"".join(a).decode() for a in streamed.outputs("finish_reason")]
    assert reasons[-1] == "length" and set(reasons[:-1]) <= {"None"}

    echoed = stream(server.grpc_url, "guarded_chat", _chat(PHONE_PROMPT, sampling, False))
    assert echoed.error is None, echoed.error
    assert echoed.text == PHONE_PROMPT + streamed.text

    refused = stream(
        server.grpc_url,
        "guarded_chat",
        [*_chat(PHONE_PROMPT, sampling), bool_input("return_output_ids", True)],
    )
    assert "return_output_ids: guarded_chat returns no token-level" in str(refused.error)


# --- guarded_chat: errors, cancellation, lifecycle ------------------------------------


def test_bad_request_names_the_field(server) -> None:
    result = stream(server.grpc_url, "guarded_chat", _chat("hi", {"top_p": 7}))
    assert "sampling_parameters.top_p" in str(result.error)
    assert _ready(server, "guarded_chat")


def test_inner_error_reaches_the_client_and_the_pipeline_stays_ready(server) -> None:
    # Only vllm_model knows its context length: the error comes from the inner step.
    result = stream(server.grpc_url, "guarded_chat", _chat("word " * 2100, GREEDY))
    assert result.error is not None
    assert "vllm_model: text_input: prompt is" in str(result.error)
    assert _ready(server, "guarded_chat")
    again = stream(server.grpc_url, "guarded_chat", _chat("Say hi.", {**GREEDY, "max_tokens": 4}))
    assert again.error is None and again.text


def _running(server) -> float:
    return requests_running(server.metrics_url, "vllm", "vllm_model")


def _cancelled(server) -> float:
    return requests_cancelled(server.metrics_url, "vllm", "vllm_model")


def test_client_cancel_cancels_the_inner_request(server) -> None:
    before = _cancelled(server)
    seen_running: list[float] = []
    result = stream(
        server.grpc_url,
        "guarded_chat",
        _chat("Tell me a long story.", LONG_GREEDY),
        stop_after=5,
        on_response=lambda n: seen_running.append(_running(server)) if n == 3 else None,
    )
    assert result.error is None and len(result.responses) == 5
    assert seen_running and seen_running[0] >= 1
    wait_for(lambda: _cancelled(server) == before + 1, what="vllm_model to count it cancelled")
    wait_for(lambda: _running(server) == 0, what="the engine's running count to return to 0")
    assert _ready(server, "guarded_chat")


def test_concurrent_requests_and_cancels_all_end(server) -> None:
    """Eight requests at once, four cancelled after their first response: every one ends
    and the pipeline answers after them. The inner calls of several requests overlap; over
    python_backend's BLS that deadlocked the stub (W17), and every request then hung."""
    sampling = {**GREEDY, "max_tokens": 24}
    holds = [
        Hold(server.grpc_url, "guarded_chat", inputs=_chat(f"Tell story {i}.", sampling))
        for i in range(8)
    ]
    try:
        for hold in holds[:4]:
            hold.wait_responses(1)
            hold.cancel()
        for hold in holds[4:]:
            hold.wait_end()
            assert hold.error is None and hold.responses >= 1
    finally:
        for hold in holds:
            hold.cancel()
    again = stream(server.grpc_url, "guarded_chat", _chat("Say hi.", {**GREEDY, "max_tokens": 4}))
    assert again.error is None and again.text


def _stubs(server, model: str) -> list:
    found = []
    for proc in server.group_processes():
        try:
            cmdline = " ".join(proc.cmdline())
        except Exception:
            continue
        if "triton_python_backend_stub" in cmdline and f"/{model}/" in cmdline:
            found.append(proc)
    return found


# Once an open issue (W12); its cause was W14, see docs/triton-2.51-workarounds.md: the
# test client cancelled requests that had already ended.
@pytest.mark.last
def test_unload_after_errors_and_cancels_is_clean_and_reload_serves(server) -> None:
    # An error and a cancellation just before the unload: the cases that once hung.
    stream(server.grpc_url, "guarded_chat", _chat("word " * 2100, GREEDY))
    stream(
        server.grpc_url,
        "guarded_chat",
        _chat("Tell me a long story.", {"max_tokens": 1500, "ignore_eos": True}),
        stop_after=2,
    )
    assert _stubs(server, "guarded_chat")
    started = time.monotonic()
    control_model(server.grpc_url, "unload", "guarded_chat")
    wait_for(
        lambda: model_state(server.http_url, "guarded_chat") == "UNAVAILABLE", what="the unload"
    )
    wait_for(lambda: not _stubs(server, "guarded_chat"), what="the stub process to exit")
    unload_s = time.monotonic() - started
    control_model(server.grpc_url, "load", "guarded_chat")
    assert _ready(server, "guarded_chat"), f"(unload took {unload_s:.1f} s)"
    again = stream(server.grpc_url, "guarded_chat", _chat("Say hi.", {**GREEDY, "max_tokens": 4}))
    assert again.error is None and again.text
