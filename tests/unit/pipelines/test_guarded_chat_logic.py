"""GuardedChat without a server: fake inner stream, fake response sender."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tritonforge.pipelines.guarded_chat import (
    ClientCancelled,
    GuardedChat,
    InnerError,
    InnerEvent,
    guard_inputs,
    sampling_json,
)
from tritonforge.serving.cancellation import CancelBoard
from tritonforge.serving.errors import RequestError
from tritonforge.serving.schema import parse_request


class FakeOutbox:
    def __init__(self, cancel_after: int | None = None) -> None:
        self.sent: list[dict] = []
        self.final: tuple[dict | None, Exception | None] | None = None
        self.cancel_after = cancel_after

    def send(self, tensors, error=None) -> None:
        assert self.final is None, "nothing may follow the final response"
        self.sent.append(tensors)

    def close(self, tensors, error) -> None:
        assert self.final is None, "exactly one final response"
        self.final = (tensors, error)

    def is_cancelled(self) -> bool:
        return self.cancel_after is not None and len(self.sent) >= self.cancel_after

    def text(self) -> str:
        tensors = [*self.sent, self.final[0]] if self.final and self.final[0] else self.sent
        return "".join(t["text_output"][0].decode() for t in tensors)


def _chat(prompt: str, board: CancelBoard, stream: bool = True, **flags: bool) -> GuardedChat:
    inputs = {
        "text_input": np.array([prompt.encode()], dtype=np.object_),
        "stream": np.array([stream]),
        **{name: np.array([value]) for name, value in flags.items()},
    }
    return GuardedChat.from_inputs(inputs, {}, "rid-1", board, cancellation_poll_s=0)


@pytest.fixture
def board(tmp_path: Path) -> CancelBoard:
    return CancelBoard(tmp_path / "board")


def _inner(*events: InnerEvent, seen: list | None = None):
    def call(tensors: dict, request_id: str) -> Iterator[InnerEvent]:
        if seen is not None:
            seen.append(tensors)
        yield from events

    return call


def test_prompt_is_redacted_before_the_llm_sees_it(board: CancelBoard) -> None:
    seen: list = []
    chat = _chat("mail jo@example.com please", board)
    outbox = FakeOutbox()
    assert chat.run(_inner(InnerEvent(text="ok"), seen=seen), outbox) == "finished"
    assert seen[0]["text_input"][0] == b"mail [EMAIL] please"
    assert seen[0]["stream"].tolist() == [True]
    first = outbox.sent[0] if outbox.sent else outbox.final[0]
    assert json.loads(first["input_findings"][0]) == [{"type": "email", "start": 5, "end": 19}]


def test_output_secret_split_across_chunks_never_reaches_the_client(board) -> None:
    chunks = ["Sure: 4111 1", "111 1111 ", "1111 is", " it."]
    outbox = FakeOutbox()
    _chat("hi", board).run(_inner(*(InnerEvent(text=c) for c in chunks)), outbox)
    assert outbox.text() == "Sure: [CARD] is it."
    streamed = [t["text_output"][0].decode() for t in outbox.sent]
    assert not any("1111" in part for part in streamed)
    findings = [f for t in outbox.sent for f in json.loads(t["output_findings"][0])]
    findings += json.loads(outbox.final[0]["output_findings"][0])
    assert findings == [{"type": "card", "start": 6, "end": 25}]


def test_non_streamed_answer_comes_whole_in_one_final_response(board) -> None:
    outbox = FakeOutbox()
    chat = _chat("hi", board, stream=False, exclude_input_in_output=True)
    chat.run(_inner(InnerEvent(text="call +44 20 "), InnerEvent(text="7946 0958")), outbox)
    assert outbox.sent == []
    assert outbox.final[0]["text_output"][0] == b"call [PHONE]"


def test_inner_error_reaches_the_client_with_its_code_after_draining(board) -> None:
    drained: list[int] = []

    def call(tensors, request_id):
        yield InnerEvent(text="partial ")
        yield InnerEvent(error="text_input: prompt is too long", code=3)
        drained.append(1)

    outbox = FakeOutbox()
    assert _chat("hi", board).run(call, outbox) == "failed"
    error = outbox.final[1]
    assert isinstance(error, InnerError) and error.code == 3
    assert str(error) == "vllm_model: text_input: prompt is too long"
    assert drained == [1]


def test_a_failing_bls_call_becomes_an_error_response(board) -> None:
    def call(tensors, request_id):
        raise RuntimeError("Failed for execute the inference request. Model 'x' is not ready.")
        yield  # pragma: no cover

    outbox = FakeOutbox()
    assert _chat("hi", board).run(call, outbox) == "failed"
    assert "is not ready" in str(outbox.final[1])


def test_client_cancel_marks_the_board_and_drains_the_inner_stream(board) -> None:
    marked: list[bool] = []

    def call(tensors, request_id):
        for i in range(5):
            marked.append(board.is_cancelled(request_id))
            yield InnerEvent(text=f"word{i} ")

    outbox = FakeOutbox(cancel_after=1)
    assert _chat("hi", board).run(call, outbox) == "cancelled"
    assert True in marked  # the callee could see the cancellation
    assert len(marked) == 5  # and the stream was drained, not abandoned
    assert isinstance(outbox.final[1], ClientCancelled)
    assert not board.is_cancelled("rid-1")  # the mark is cleared afterwards


def test_a_cancel_while_the_inner_model_is_silent_ends_the_request_once(board) -> None:
    """The inner stream's empty events (nothing arrived yet) are where the run looks at
    its client: a request whose inner model never answers still ends when cancelled."""
    outbox = FakeOutbox()
    polls: list[bool] = []

    def silent(tensors, request_id):
        while not board.is_cancelled(request_id):  # a callee queued, prefilling, stuck
            polls.append(True)
            if len(polls) == 3:
                outbox.cancel_after = 0  # the client goes away meanwhile
            yield InnerEvent()

    assert _chat("hi", board).run(silent, outbox) == "cancelled"
    assert outbox.sent == [] and isinstance(outbox.final[1], ClientCancelled)
    assert len(polls) == 3  # seen at the first empty event after the cancel


def test_sampling_parameters_merge_request_parameters_and_tensor() -> None:
    merged = sampling_json({"max_tokens": 5, "timeout": 3}, '{"temperature": 0}')
    assert json.loads(merged) == {"max_tokens": 5, "temperature": 0}
    assert sampling_json({}, None) is None


def test_the_inner_request_carries_both_sampling_channels_as_one_tensor(board) -> None:
    inputs = {
        "text_input": np.array([b"hi"], dtype=np.object_),
        "sampling_parameters": np.array([b'{"temperature": 0}'], dtype=np.object_),
    }
    parameters = {"max_tokens": 5, "temperature": 1, "timeout": 3}
    chat = GuardedChat.from_inputs(inputs, parameters, "rid-1", board)
    sent = chat.inputs.tensors["sampling_parameters"][0]
    assert json.loads(sent) == {"max_tokens": 5, "temperature": 0}
    assert "sampling_parameters" not in _chat("hi", board).inputs.tensors


def test_cancel_board_marks_clears_and_tidies(tmp_path: Path) -> None:
    board = CancelBoard(tmp_path / "board")
    assert not board.is_cancelled("any id / with slashes")
    board.cancel("any id / with slashes")
    assert board.is_cancelled("any id / with slashes") and not board.is_cancelled("other")
    board.clear("any id / with slashes")
    board.tidy()
    assert not (tmp_path / "board").exists()


def test_chat_messages_are_redacted_one_by_one() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Call +1 (415) 555-2671 about IBAN GB82WEST12345698765432"},
    ]
    inputs = {"messages": np.array([json.dumps(messages).encode()], dtype=np.object_)}
    guarded = guard_inputs(parse_request(inputs), {})
    sent = json.loads(guarded.tensors["messages"][0])
    assert sent[0] == messages[0]
    assert sent[1] == {"role": "user", "content": "Call [PHONE] about IBAN [IBAN]"}
    assert [(f["type"], f["message"]) for f in guarded.findings] == [("phone", 1), ("iban", 1)]


def test_non_streamed_text_prompt_is_echoed_redacted_unless_excluded(board) -> None:
    # The schema's rule for every LLM model (docs/reference/requests.md), guarded: the
    # echo is redacted.
    outbox = FakeOutbox()
    _chat("mail jo@example.com:", board, stream=False).run(_inner(InnerEvent(text=" ok")), outbox)
    assert outbox.final[0]["text_output"][0] == b"mail [EMAIL]: ok"
    outbox = FakeOutbox()
    chat = _chat("mail jo@example.com:", board, stream=False, exclude_input_in_output=False)
    chat.run(_inner(InnerEvent(text=" ok")), outbox)
    assert outbox.final[0]["text_output"][0] == b"mail [EMAIL]: ok"
    # Streaming never echoes, and takes exclude_input_in_output=true as every model does.
    outbox = FakeOutbox()
    _chat("hi", board, exclude_input_in_output=True).run(_inner(InnerEvent(text="yo")), outbox)
    assert outbox.text() == "yo"


def test_finish_reason_and_token_counts_are_relayed_from_the_inner_model(board) -> None:
    seen: list = []
    flags = {
        f"return_{n}": True for n in ("finish_reason", "num_input_tokens", "num_output_tokens")
    }
    chat = _chat("Say hi", board, **flags)
    events = [
        InnerEvent(
            text="call +44 20 ", finish_reason="None", num_input_tokens=3, num_output_tokens=4
        ),
        InnerEvent(text="7946 0958", finish_reason="None", num_input_tokens=3, num_output_tokens=5),
        InnerEvent(text=".", finish_reason="length", num_input_tokens=3, num_output_tokens=1),
    ]
    outbox = FakeOutbox()
    chat.run(_inner(*events, seen=seen), outbox)
    assert all(seen[0][name].tolist() == [True] for name in flags)
    responses = [*outbox.sent, outbox.final[0]]
    assert sum(int(r["num_output_tokens"][0]) for r in responses) == 10
    assert {int(r["num_input_tokens"][0]) for r in responses} == {3}
    reasons = [r["finish_reason"][0].decode() for r in responses]
    assert reasons[-1] == "length" and set(reasons[:-1]) <= {"None"}
    assert outbox.text() == "call [PHONE]."

    whole = FakeOutbox()
    _chat("Say hi", board, stream=False, **flags).run(_inner(*events), whole)
    assert int(whole.final[0]["num_output_tokens"][0]) == 10
    assert whole.final[0]["finish_reason"][0] == b"length"


@pytest.mark.parametrize(
    "name", ["return_logprobs", "return_output_ids", "return_cumulative_logprob"]
)
def test_token_level_outputs_are_refused_naming_the_flag(name: str) -> None:
    inputs = {
        "text_input": np.array([b"hi"], dtype=np.object_),
        name: np.array([True]),
    }
    with pytest.raises(RequestError, match=f"^{name}: guarded_chat returns no token-level"):
        guard_inputs(parse_request(inputs), {})
    inputs[name] = np.array([False])
    guard_inputs(parse_request(inputs), {})  # asked not to: fine


def test_tool_calls_are_redacted_and_tools_relayed() -> None:
    call = {
        "type": "function",
        "function": {"name": "mail", "arguments": '{"to": "ann@example.com", "n": 2}'},
    }
    tools = [{"type": "function", "function": {"name": "mail"}}]
    chat = {
        "messages": [
            {"role": "user", "content": "Mail Ann"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "sent to ann@example.com"},
        ],
        "tools": tools,
    }
    inputs = {"messages": np.array([json.dumps(chat).encode()], dtype=np.object_)}
    guarded = guard_inputs(parse_request(inputs), {})
    sent = json.loads(guarded.tensors["messages"][0])
    assert sent["tools"] == tools
    assistant, tool = sent["messages"][1:]
    assert assistant["content"] is None
    assert assistant["tool_calls"][0]["function"]["arguments"] == {"to": "[EMAIL]", "n": 2}
    assert tool == {"role": "tool", "content": "sent to [EMAIL]", "tool_call_id": "c1"}
    assert [(f["type"], f["message"]) for f in guarded.findings] == [("email", 1), ("email", 2)]
