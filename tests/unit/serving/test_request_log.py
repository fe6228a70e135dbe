"""One line per request, off unless TRITONFORGE_LOG_REQUESTS turns it on (request_log.py)."""

from __future__ import annotations

import pytest

from tests import fakes
from tests.unit.serving.test_request_ids import IdEngine
from tests.unit.serving.test_tracing import (
    CLIENT_SPAN,
    CLIENT_TRACE,
    PROMPT,
    Kept,
    canary_request,
    runtime_tracer_keeping,
)
from tritonforge.serving.errors import RequestError
from tritonforge.serving.request_log import LOG_REQUESTS_ENV, log_requests_from_env, request_line
from tritonforge.serving.runtime import RequestRecord, Runtime


@pytest.mark.parametrize("value", ["1", "true", "ON", " yes "])
def test_the_variable_turns_the_lines_on(value: str) -> None:
    assert log_requests_from_env({LOG_REQUESTS_ENV: value}) is True


@pytest.mark.parametrize("value", ["", "0", "false", "Off", "no"])
def test_the_lines_are_off_by_default_and_when_turned_off(value: str) -> None:
    assert log_requests_from_env({}) is False
    assert log_requests_from_env({LOG_REQUESTS_ENV: value}) is False


def test_a_value_that_is_neither_on_nor_off_names_the_variable() -> None:
    with pytest.raises(RequestError, match=LOG_REQUESTS_ENV) as error:
        log_requests_from_env({LOG_REQUESTS_ENV: "sometimes"})
    assert "'sometimes'" in str(error.value)


def test_a_line_says_only_what_is_known() -> None:
    assert request_line("r1", "refused") == "request r1: refused"
    record = RequestRecord(
        prompt_tokens=46,
        generation_tokens=8,
        e2e_s=0.0874,
        ttft_s=0.0161,
        tpot_s=None,
        outcome="finished",
    )
    assert request_line("r2", "finished", record, 0xAB) == (
        "request r2: finished, 46 prompt + 8 output tokens, first token after 16 ms, 87 ms "
        f"(trace {0xAB:032x})"
    )


def lines_about(logger: fakes.RecordingLogger, request_id: str) -> list[str]:
    return [line for line in logger.infos if f"request {request_id}:" in line]


def served(log_requests: bool, engine: object | None = None) -> fakes.RecordingLogger:
    logger = fakes.RecordingLogger()
    fakes.serve_once(
        engine or fakes.ScriptedEngine(fakes.word_script(4)),  # type: ignore[arg-type]
        canary_request(),
        fakes.RecordingChannel(),
        logger=logger,
        log_requests=log_requests,
    )
    return logger


def test_on_a_finished_request_has_one_line_with_its_outcome_and_tokens() -> None:
    logger = fakes.RecordingLogger()
    runtime = Runtime(
        fakes.ScriptedEngine(fakes.word_script(4)),
        fakes.RecordingMetrics(),
        logger,
        log_requests=True,
    )
    runtime.start()
    try:
        channel = fakes.RecordingChannel()
        runtime.submit(canary_request(), channel, request_id="logged-1")
        assert channel.done.wait(10)
    finally:
        runtime.stop()  # its response threads end: the line after the FINAL is written
    [line] = lines_about(logger, "logged-1")
    assert ": finished, " in line and " + 4 output tokens" in line
    assert "(trace " not in line  # not traced
    assert PROMPT not in "\n".join(logger.infos)


def test_off_no_line_is_written_about_a_request() -> None:
    logger = served(log_requests=False)
    assert not [line for line in logger.infos if "request " in line and ": finished" in line]


def test_on_a_failed_request_has_a_line_saying_so() -> None:
    logger = served(log_requests=True, engine=IdEngine(fail=True))
    assert any(": failed" in line for line in logger.infos)


def test_on_a_traced_request_names_its_trace_and_a_refused_one_is_logged(
    exporter: Kept,
) -> None:
    logger = fakes.RecordingLogger()
    runtime = Runtime(
        fakes.ScriptedEngine(fakes.word_script(4), delay_s=0.02),
        fakes.RecordingMetrics(),
        logger,
        tracer=runtime_tracer_keeping(exporter),
        log_requests=True,
    )
    runtime.start()
    try:
        first = fakes.RecordingChannel()
        traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
        runtime.submit(canary_request(), first, request_id="twice", traceparent=traceparent)
        with pytest.raises(RequestError):
            runtime.submit(canary_request(), fakes.RecordingChannel(), request_id="twice")
        assert first.done.wait(10)
    finally:
        runtime.stop()
    finished, refused = (
        [line for line in lines_about(logger, "twice") if f": {outcome}" in line]
        for outcome in ("finished", "refused")
    )
    assert len(finished) == 1 and f"(trace {CLIENT_TRACE})" in finished[0]
    assert len(refused) == 1


@pytest.fixture
def exporter() -> Kept:
    return Kept()
