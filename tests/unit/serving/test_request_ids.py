"""A request's id: the client's, checked, made when missing, unique among those in flight,
and the one the engine, the logs and the errors carry. Real Runtime, scripted engine."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests import fakes
from tritonforge.engines.base import EngineOutput, PreparedPrompt
from tritonforge.serving.errors import RequestError
from tritonforge.serving.request_ids import (
    MAX_REQUEST_ID_CHARS,
    DuplicateRequestId,
    check_request_id,
)
from tritonforge.serving.runtime import Runtime
from tritonforge.serving.sampling import SamplingParams


class IdEngine(fakes.ScriptedEngine):
    """Keeps the id of every request it was handed; fails a request when told to."""

    def __init__(self, fail: bool = False, delay_s: float = 0.0) -> None:
        super().__init__(fakes.word_script(3), delay_s=delay_s)
        self.seen: list[str] = []
        self.fail = fail

    async def generate(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingParams
    ) -> AsyncIterator[EngineOutput]:
        self.seen.append(request_id)
        if self.fail:
            raise RuntimeError("the engine broke")
        async for delta in super().generate(request_id, prompt, sampling):
            yield delta


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("", "must not be empty"),
        ("x" * (MAX_REQUEST_ID_CHARS + 1), f"at most {MAX_REQUEST_ID_CHARS} characters"),
        ("two words", "visible ASCII"),
        ("tab\there", "visible ASCII"),
        ("café", "visible ASCII"),
    ],
)
def test_an_unusable_id_is_refused_naming_the_field_and_rule(value: str, rule: str) -> None:
    with pytest.raises(RequestError) as refused:
        check_request_id(value, "id")
    assert refused.value.field == "id" and rule in refused.value.rule


def test_a_usable_id_is_kept_as_it_is() -> None:
    value = "req-01:ABC_x.y/z" + "9" * 100
    assert check_request_id(value, "id") == value


def test_the_engine_gets_the_clients_id_or_one_made_for_the_request() -> None:
    engine = IdEngine()
    runtime = Runtime(engine, fakes.RecordingMetrics(), fakes.RecordingLogger())
    runtime.start()
    try:
        given, anonymous = fakes.RecordingChannel(), fakes.RecordingChannel()
        runtime.submit(fakes.sampling_request(True), given, request_id="client-7")
        runtime.submit(fakes.sampling_request(True), anonymous)
        assert given.done.wait(10) and anonymous.done.wait(10)
    finally:
        runtime.stop()
    assert engine.seen[0] == "client-7"
    made = engine.seen[1]
    assert len(made) == 32 and int(made, 16) >= 0  # a uuid4 in hex


def test_a_second_request_under_an_id_in_flight_is_refused_and_the_first_goes_on() -> None:
    engine = IdEngine(delay_s=0.2)
    runtime = Runtime(engine, fakes.RecordingMetrics(), fakes.RecordingLogger())
    first, later = fakes.RecordingChannel(), fakes.RecordingChannel()
    runtime.start()
    try:
        runtime.submit(fakes.sampling_request(True), first, request_id="same")
        with pytest.raises(DuplicateRequestId) as refused:
            runtime.submit(
                fakes.sampling_request(True), fakes.RecordingChannel(), request_id="same"
            )
        assert first.done.wait(10), "the first request never ended"
        runtime.submit(fakes.sampling_request(True), later, request_id="same")  # free again
        assert later.done.wait(10)
    finally:
        runtime.stop()
    assert refused.value.field == "id"
    assert "'same' is already in flight" in refused.value.rule
    assert first.errors() == [] and later.errors() == []


def test_a_failed_requests_log_line_names_the_clients_id() -> None:
    logger = fakes.RecordingLogger()
    runtime = Runtime(IdEngine(fail=True), fakes.RecordingMetrics(), logger)
    channel = fakes.RecordingChannel()
    runtime.start()
    try:
        runtime.submit(fakes.sampling_request(True), channel, request_id="client-42")
        assert channel.done.wait(10)
    finally:
        runtime.stop()
    assert any("request client-42 failed" in line for line in logger.errors), logger.errors


def test_guarded_chats_inner_request_names_the_clients_id_and_is_its_own() -> None:
    from tritonforge.pipelines.guarded_chat import inner_request_id

    first, second = inner_request_id("client-7"), inner_request_id("client-7")
    assert first.startswith("client-7/guarded_chat-") and first != second
    assert inner_request_id("").startswith("guarded_chat-")  # no id: its own only
    assert inner_request_id("two words").startswith("guarded_chat-")  # unusable: the same
    assert check_request_id(inner_request_id("x" * 128), "id")  # a long one still fits
