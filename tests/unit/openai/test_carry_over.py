"""The rules of carrying a request over a tritonserver restart (carry_over.py).

The rules alone (deadline, waiting room, resend), then the routes over a fake gateway
whose streams fail as a dead Triton's calls do (:class:`TritonDown`): a request that sent
nothing is answered by its resend, once, a stream that sent tokens is never replayed.
The real restart is tests/e2e/test_crash_recovery.py's part.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from fastapi.testclient import TestClient

from tests.unit.openai.test_openai_translate import FakeGateway, FakeStream, deltas, sse_events
from tritonforge.openai import request_context
from tritonforge.openai.app import create_app
from tritonforge.openai.carry_over import (
    CarryOver,
    CarryOverSettings,
    Clock,
    may_resend,
    timeout_of,
)
from tritonforge.openai.errors import TRITON_DOWN_RETRY_AFTER_S, OpenAIError, unreachable
from tritonforge.openai.translate import ModelOutput, TritonRequest

USER = [{"role": "user", "content": "hi"}]


def _down() -> OpenAIError:
    return unreachable("fake:1", "Socket closed")


class Restarting(FakeGateway):
    """A fake Triton whose model is ready again (or never) after its outage."""

    def __init__(
        self, *scripts: list[ModelOutput | OpenAIError], ready: bool = True, down_polls: int = 0
    ) -> None:
        super().__init__(*scripts)
        self.ready = ready
        self.down_polls = down_polls  # polls answered "not ready" before the model is back
        self.polls = 0
        self.ids: list[str | None] = []

    async def model_ready(self, model: str) -> bool:
        self.polls += 1
        return self.ready and self.polls > self.down_polls

    def stream(self, model: str, request: TritonRequest) -> FakeStream:
        context = request_context.current()  # what the real gateway sends as Triton's id
        self.ids.append(context.request_id if context else None)
        return super().stream(model, request)


def _client(gateway: FakeGateway, **settings: float) -> TestClient:
    carry = CarryOverSettings(poll_s=0.01, **settings)  # type: ignore[arg-type]
    app = create_app("fake:1", 99, gateway=gateway, carry_over_settings=carry)  # type: ignore[arg-type]
    return TestClient(app)


# --- the rules ----------------------------------------------------------------------


def test_the_deadline_counts_from_the_first_arrival() -> None:
    settings = CarryOverSettings(max_wait_s=300)
    clock = Clock(timeout_s=30, arrived=1000.0)
    assert clock.deadline(settings) == 1030.0
    assert clock.resend_timeout_s(now=1012.5) == 17.5  # what is left, not 30 again
    assert clock.resend_timeout_s(now=1031.0) == -1.0
    no_deadline = Clock(timeout_s=None, arrived=1000.0)
    assert no_deadline.deadline(settings) == 1300.0  # the frontend's --restart-wait
    assert no_deadline.resend_timeout_s(now=1012.5) is None


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [(30, 30.0), ("2.5", 2.5), (None, None), ("hot", None), (0, None), (-1, None), (True, None)],
)
def test_timeout_s_read_from_the_body(raw: object, seconds: float | None) -> None:
    assert timeout_of({} if raw is None else {"timeout_s": raw}) == seconds


def test_a_resend_carries_what_is_left_of_its_deadline() -> None:
    carry = CarryOver(lambda _m: asyncio.sleep(0, True))
    sampling: dict[str, object] = {"timeout_s": 30}
    clock = Clock(timeout_s=30, arrived=time.monotonic() - 10)  # it arrived 10 s ago
    carry.prepare_resend(sampling, "llm", clock, resends=0)
    assert sampling["timeout_s"] == 30  # the first send is the body's own
    carry.prepare_resend(sampling, "llm", clock, resends=1)
    assert 19 < float(sampling["timeout_s"]) <= 20  # type: ignore[arg-type]
    late = Clock(timeout_s=30, arrived=clock.arrived - 31)
    with pytest.raises(OpenAIError) as passed:
        carry.prepare_resend(sampling, "llm", late, resends=1)
    assert passed.value.code == "server_restarted"


def test_never_resend_once_a_character_reached_the_client() -> None:
    assert may_resend(0)
    assert not may_resend(1)


def test_the_deadline_passing_while_waiting_names_the_restart() -> None:
    async def never(_model: str) -> bool:
        return False

    async def scenario() -> tuple[OpenAIError, OpenAIError]:
        carry = CarryOver(never, CarryOverSettings(max_wait_s=0.05, poll_s=0.01))
        errors = []
        for timeout_s in (0.05, None):
            with pytest.raises(OpenAIError) as passed:
                await carry.wait_for("llm", Clock(timeout_s=timeout_s))
            errors.append(passed.value)
        assert carry.waiting == 0
        return errors[0], errors[1]

    own, frontends = asyncio.run(scenario())
    for error in (own, frontends):
        assert error.status == 503 and error.code == "server_restarted"
        assert "tritonserver restarted" in error.message and "`llm`" in error.message
        assert error.retry_after_s == TRITON_DOWN_RETRY_AFTER_S
    assert "timeout_s of 0.05 s" in own.message
    assert "--restart-wait of 0.05 s" in frontends.message


def test_the_waiting_room_is_bounded() -> None:
    ready = asyncio.Event()

    async def when_set(_model: str) -> bool:
        return ready.is_set()

    async def scenario() -> OpenAIError:
        carry = CarryOver(when_set, CarryOverSettings(max_waiting=1, poll_s=0.01))
        first = asyncio.ensure_future(carry.wait_for("llm", Clock(timeout_s=60)))
        while carry.waiting == 0:
            await asyncio.sleep(0)
        with pytest.raises(OpenAIError) as full:
            await carry.wait_for("llm", Clock(timeout_s=60))
        ready.set()
        await first  # the one inside is served once the model is ready
        assert carry.waiting == 0
        return full.value

    full = asyncio.run(scenario())
    assert full.status == 503 and full.retry_after_s == TRITON_DOWN_RETRY_AFTER_S
    assert "1 requests already wait" in full.message and "--max-waiting" in full.message


def test_waiters_share_one_poll_and_a_cancelled_one_leaves_the_others_waiting() -> None:
    ready = asyncio.Event()
    asking = {"now": 0, "most": 0, "calls": 0}

    async def when_set(_model: str) -> bool:
        asking["now"] += 1
        asking["calls"] += 1
        asking["most"] = max(asking["most"], asking["now"])
        await asyncio.sleep(0.005)  # a call in flight while the other waiters wait too
        asking["now"] -= 1
        return ready.is_set()

    async def scenario() -> None:
        carry = CarryOver(when_set, CarryOverSettings(poll_s=0.01))
        waiters = [asyncio.ensure_future(carry.wait_for("llm", Clock(60))) for _ in range(3)]
        while carry.waiting < 3 or asking["calls"] < 3:
            await asyncio.sleep(0.01)
        waiters[0].cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiters[0]
        ready.set()
        await asyncio.gather(*waiters[1:])
        assert carry.waiting == 0

    asyncio.run(scenario())
    assert asking["most"] == 1  # one poll for the model, never one per waiter


# --- the routes -----------------------------------------------------------------------


def test_a_non_streamed_request_is_answered_once_by_its_resend() -> None:
    lost = [ModelOutput("Hal", "None", 4, 1), _down()]  # part-generated when Triton died
    gateway = Restarting(lost, deltas(), down_polls=1)  # down for one poll (0.01 s) at least
    body = {"model": "llm", "messages": USER, "timeout_s": 60}
    headers = {"X-Request-Id": "carried-1"}
    reply = _client(gateway).post("/v1/chat/completions", json=body, headers=headers)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-request-id"] == "carried-1"
    assert gateway.ids == ["carried-1", "carried-1"]  # the resend keeps the Triton id
    assert reply.json()["choices"][0]["message"]["content"] == "Hello"  # the resend's alone
    assert len(gateway.sent) == 2 and gateway.polls == 2
    assert gateway.sent[0]["timeout_s"] == 60
    assert 0 < gateway.sent[1]["timeout_s"] < 60  # the deadline from the first arrival


def test_a_stream_that_sent_nothing_is_resent_and_streamed_from_its_first_token() -> None:
    gateway = Restarting([_down()], deltas())
    body = {"model": "llm", "messages": USER, "stream": True}
    reply = _client(gateway).post("/v1/chat/completions", json=body)
    assert reply.status_code == 200
    events = sse_events(reply.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert not [c for c in chunks if "error" in c]
    roles = [c for c in chunks if c["choices"][0]["delta"].get("role")]
    assert len(roles) == 1  # one beginning
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == "Hello"
    assert len(gateway.sent) == 2


def test_a_stream_that_sent_tokens_ends_with_the_restart_and_is_never_replayed() -> None:
    gateway = Restarting([ModelOutput("Hel", "None", 4, 1), _down()], deltas())
    body = {"model": "llm", "messages": USER, "stream": True}
    reply = _client(gateway).post("/v1/chat/completions", json=body)
    events = sse_events(reply.text)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "server_restarted"
    assert "tritonserver restarted after this stream had sent 1 tokens" in error["message"]
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-2])
    assert text == "Hel"
    assert len(gateway.sent) == 1 and gateway.polls == 0  # never sent again


def test_a_request_whose_deadline_passes_in_the_outage_ends_naming_the_restart() -> None:
    gateway = Restarting([_down()], ready=False)
    for stream in (False, True):
        gateway.scripts = [[_down()]]
        body = {"model": "llm", "messages": USER, "stream": stream, "timeout_s": 0.2}
        reply = _client(gateway).post("/v1/chat/completions", json=body)
        assert reply.status_code == 503, reply.text
        error = reply.json()["error"]
        assert error["code"] == "server_restarted" and "timeout_s of 0.2 s" in error["message"]
        assert reply.headers["retry-after"] == str(TRITON_DOWN_RETRY_AFTER_S)


def test_past_the_waiting_room_a_request_gets_503_with_retry_after() -> None:
    gateway = Restarting([_down()], ready=False)
    client = _client(gateway, max_waiting=0)  # room for none: the bound itself
    reply = client.post("/v1/chat/completions", json={"model": "llm", "messages": USER})
    assert reply.status_code == 503
    assert reply.json()["error"]["code"] == "service_unavailable"
    assert "--max-waiting" in reply.json()["error"]["message"]
    assert reply.headers["retry-after"] == str(TRITON_DOWN_RETRY_AFTER_S)
