"""The runtime's spans of a request, kept as the export requests its tracer sends and read
back as the receiver reads them: their tree under the caller's traceparent, their gen_ai
attributes, the status of an error and of a cancel, and never a prompt's text. Real
Runtime, scripted engine; no server."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest

from tests import fakes
from tests.unit.serving.test_request_ids import IdEngine
from tritonforge.engines.base import EngineOutput, PreparedPrompt
from tritonforge.serving.admission import Admission, AdmissionSettings
from tritonforge.serving.errors import RequestError
from tritonforge.serving.runtime import Runtime
from tritonforge.serving.sampling import SamplingParams
from tritonforge.serving.schema import GenerateRequest, parse_request
from tritonforge.serving.tracing import (
    ENDPOINT_ENV,
    OTEL_ENDPOINT_ENV,
    SAMPLING_ENV,
    RuntimeTracer,
    TraceSettings,
    context_traceparent,
    engine_trace_headers,
    parse_traceparent,
    runtime_tracer,
    tracer,
)
from tritonforge.trace.otlp import SpanRecord, decode, otlp_json, spans_of

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
PROMPT = "canary-91e2 what is in this prompt stays out of every span"


class Kept:
    """Stands in for the OTLP/HTTP POST: keeps each encoded export request."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def __call__(self, body: bytes) -> None:
        self.bodies.append(body)

    def get_finished_spans(self) -> list[SpanRecord]:
        """Every span sent so far, read back as the receiver and the timeline read them."""
        return [
            span
            for body in self.bodies
            for span in spans_of(otlp_json(decode(body, "application/x-protobuf")))
        ]


def runtime_tracer_keeping(exporter: Kept) -> RuntimeTracer:
    settings = TraceSettings("http://unused", 1.0)
    return RuntimeTracer(tracer(settings, "test", "tritonforge.serving", exporter, env={}), "m")


@pytest.fixture
def exporter() -> Kept:
    return Kept()


@pytest.fixture
def runtime(exporter: Kept) -> Iterator[Runtime]:
    tracer = runtime_tracer_keeping(exporter)
    engine = fakes.ScriptedEngine(fakes.word_script(4), delay_s=0.02)  # sent one by one
    runtime = Runtime(engine, fakes.RecordingMetrics(), fakes.RecordingLogger(), tracer=tracer)
    runtime.start()
    yield runtime
    runtime.stop()


def canary_request(stream: bool = True) -> GenerateRequest:
    inputs = {
        "text_input": np.array([PROMPT.encode()], dtype=np.object_),
        "stream": np.array([stream]),
    }
    return parse_request(inputs)


def finished_spans(runtime: Runtime, exporter: Kept, roots: int = 1) -> list[SpanRecord]:
    """Every span exported once each root ended (a root ends just after its FINAL send,
    which is what a test's channel waits for)."""
    assert runtime.tracer is not None
    deadline = time.monotonic() + 10
    while True:
        runtime.tracer.flush()
        spans = list(exporter.get_finished_spans())
        ended = sum(1 for span in spans if span.name == "tritonforge.request")
        if ended >= roots or time.monotonic() > deadline:
            return spans
        time.sleep(0.01)


def by_name(spans: list[SpanRecord]) -> dict[str, SpanRecord]:
    return {span.name: span for span in spans}


def test_a_streamed_request_is_one_tree_under_the_callers_span(
    runtime: Runtime, exporter: Kept
) -> None:
    channel = fakes.RecordingChannel()
    runtime.submit(
        canary_request(),
        channel,
        request_id="rid-1",
        traceparent=f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01",
    )
    assert channel.done.wait(10)
    spans = by_name(finished_spans(runtime, exporter))
    root = spans["tritonforge.request"]
    assert root.parent_id == CLIENT_SPAN and root.service == "test"
    assert root.trace_id == CLIENT_TRACE
    for name in ("queue", "prefill", "decode", "sends", "response.final"):
        child = spans[f"tritonforge.{name}"]
        assert child.parent_id == root.span_id and child.trace_id == CLIENT_TRACE, name
        assert root.start_ns <= child.start_ns <= child.end_ns <= root.end_ns, name
    attributes = root.attributes
    assert attributes["tritonforge.request_id"] == "rid-1"
    assert attributes["gen_ai.request.model"] == "m"
    assert attributes["gen_ai.usage.input_tokens"] == len(PROMPT)
    assert attributes["gen_ai.usage.output_tokens"] == 4
    assert attributes["gen_ai.response.finish_reasons"] == ["length"]
    assert float(str(attributes["gen_ai.server.time_to_first_token"])) >= 0
    assert attributes["tritonforge.outcome"] == "finished"
    assert root.error is None
    sends = spans["tritonforge.sends"].attributes["tritonforge.sends.count"]
    assert 1 <= int(str(sends)) <= 3  # the deltas before the last (unless coalesced)
    text = json.dumps([dict(span.attributes) for span in spans.values()], default=str)
    assert PROMPT not in text and "w0" not in text  # neither the prompt nor the output


def test_a_request_without_a_traceparent_starts_a_trace_of_its_own(
    runtime: Runtime, exporter: Kept
) -> None:
    channel = fakes.RecordingChannel()
    runtime.submit(canary_request(stream=False), channel, request_id="rid-2")
    assert channel.done.wait(10)
    root = by_name(finished_spans(runtime, exporter))["tritonforge.request"]
    assert root.parent_id == ""


def test_a_cancelled_request_ends_its_span_in_error_saying_so(
    exporter: Kept,
) -> None:
    tracer = runtime_tracer_keeping(exporter)
    engine = fakes.ScriptedEngine(fakes.word_script(50), delay_s=0.02)
    runtime = Runtime(
        engine,
        fakes.RecordingMetrics(),
        fakes.RecordingLogger(),
        tracer=tracer,
        cancellation_poll_s=0.01,
    )
    channel = fakes.RecordingChannel(cancel_after=2)
    runtime.start()
    try:
        runtime.submit(canary_request(), channel, request_id="rid-3")
        assert channel.done.wait(10)
    finally:
        runtime.stop()
    root = by_name(list(exporter.get_finished_spans()))["tritonforge.request"]
    assert root.attributes["tritonforge.outcome"] == "cancelled"
    assert root.error == "cancelled by the client"


def test_a_failed_request_ends_its_span_in_error_with_the_reason(
    exporter: Kept,
) -> None:
    tracer = runtime_tracer_keeping(exporter)
    runtime = Runtime(
        IdEngine(fail=True), fakes.RecordingMetrics(), fakes.RecordingLogger(), tracer=tracer
    )
    channel = fakes.RecordingChannel()
    runtime.start()
    try:
        runtime.submit(canary_request(), channel, request_id="rid-4")
        assert channel.done.wait(10)
    finally:
        runtime.stop()
    root = by_name(list(exporter.get_finished_spans()))["tritonforge.request"]
    assert root.attributes["tritonforge.outcome"] == "failed"
    assert root.error is not None and "the engine broke" in root.error


def test_a_refused_request_ends_its_span_at_once(runtime: Runtime, exporter: Kept) -> None:
    first = fakes.RecordingChannel()
    runtime.submit(canary_request(), first, request_id="twice")
    with pytest.raises(RequestError):
        runtime.submit(canary_request(), fakes.RecordingChannel(), request_id="twice")
    assert first.done.wait(10)
    refused = [
        span
        for span in finished_spans(runtime, exporter, roots=2)
        if span.attributes.get("tritonforge.outcome") == "refused"
    ]
    assert len(refused) == 1 and refused[0].error is not None
    assert "already in flight" in refused[0].error


def test_a_caller_that_did_not_sample_its_trace_gets_no_spans(
    runtime: Runtime, exporter: Kept
) -> None:
    channel = fakes.RecordingChannel()
    runtime.submit(canary_request(), channel, traceparent=f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00")
    assert channel.done.wait(10)
    assert finished_spans(runtime, exporter, roots=0) == []
    assert type(channel) is fakes.RecordingChannel  # its sends were not wrapped either


def test_tracing_is_off_unless_an_endpoint_is_configured() -> None:
    assert runtime_tracer("m", {}) is None
    assert runtime_tracer("m", {ENDPOINT_ENV: "http://x/v1/traces", SAMPLING_ENV: "0"}) is None
    assert TraceSettings.from_env({OTEL_ENDPOINT_ENV: "http://y/v1/traces"}).enabled


@pytest.mark.parametrize(("raw", "rule"), [("half", "a number"), ("1.5", "in [0, 1]")])
def test_a_bad_sampling_ratio_names_its_variable(raw: str, rule: str) -> None:
    with pytest.raises(RequestError) as refused:
        TraceSettings.from_env({ENDPOINT_ENV: "http://x", SAMPLING_ENV: raw})
    assert refused.value.field == SAMPLING_ENV and rule in refused.value.rule


def test_tritons_trace_context_gives_its_traceparent() -> None:
    value = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    assert context_traceparent(json.dumps({"traceparent": value})) == value
    assert context_traceparent(None) is None
    assert context_traceparent("not json") is None
    assert context_traceparent("{}") is None


def test_admission_shows_its_decision_and_prediction(exporter: Kept) -> None:
    tracer = runtime_tracer_keeping(exporter)
    admission = Admission(AdmissionSettings(mode="observe"))
    engine = fakes.ScriptedEngine(fakes.word_script(3))
    runtime = Runtime(
        engine,
        fakes.RecordingMetrics(),
        fakes.RecordingLogger(),
        tracer=tracer,
        admission=admission,
    )
    runtime.start()
    try:
        for request_id, sampling in (("no-slo", {}), ("slo", {"slo_ttft_ms": 500})):
            channel = fakes.RecordingChannel()
            runtime.submit(fakes.sampling_request(True, **sampling), channel, request_id=request_id)
            assert channel.done.wait(10)
    finally:
        runtime.stop()
    spans = list(exporter.get_finished_spans())
    decisions = {}
    for span in spans:
        if span.name == "tritonforge.admission":
            root = next(s for s in spans if s.span_id == span.parent_id)
            request_id = root.attributes["tritonforge.request_id"]
            decisions[request_id] = dict(span.attributes)
    assert decisions["no-slo"]["tritonforge.admission.decision"] == "no_slo"
    assert decisions["slo"]["tritonforge.admission.decision"] == "admitted"


def test_a_traceparent_parameter_is_transport_not_sampling() -> None:
    """The OpenAI frontend sends it to any model it serves, guarded_chat included."""
    from tritonforge.pipelines.guarded_chat import GuardedChat
    from tritonforge.serving.cancellation import CancelBoard

    inputs = {"text_input": np.array([b"hi"], dtype=np.object_)}
    parameters = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "max_tokens": 3}
    assert parse_request(inputs, parameters).sampling.max_tokens == 3
    chat = GuardedChat.from_inputs(inputs, parameters, "inner-1", CancelBoard())
    assert json.loads(chat.inputs.tensors["sampling_parameters"][0]) == {"max_tokens": 3}


class HeaderEngine(fakes.ScriptedEngine):
    """Keeps what an engine that traces itself would be handed for each request."""

    def __init__(self) -> None:
        super().__init__(fakes.word_script(2))
        self.headers: dict[str, dict[str, str] | None] = {}

    async def generate(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingParams
    ) -> AsyncIterator[EngineOutput]:
        self.headers[request_id] = engine_trace_headers()
        async for delta in super().generate(request_id, prompt, sampling):
            yield delta


def test_an_engine_that_traces_itself_gets_the_request_span_as_parent(
    exporter: Kept,
) -> None:
    tracer = runtime_tracer_keeping(exporter)
    engine = HeaderEngine()
    runtime = Runtime(engine, fakes.RecordingMetrics(), fakes.RecordingLogger(), tracer=tracer)
    runtime.start()
    try:
        for request_id, traceparent in (
            ("traced", f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"),
            ("not-sampled", f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"),
        ):
            channel = fakes.RecordingChannel()
            runtime.submit(
                canary_request(), channel, request_id=request_id, traceparent=traceparent
            )
            assert channel.done.wait(10)
    finally:
        runtime.stop()
    root = by_name(list(exporter.get_finished_spans()))["tritonforge.request"]
    expected = f"00-{CLIENT_TRACE}-{root.span_id}-01"
    assert engine.headers == {"traced": {"traceparent": expected}, "not-sampled": None}


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "not a traceparent",
        f"ff-{CLIENT_TRACE}-{CLIENT_SPAN}-01",  # version ff is invalid
        f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01-more",  # version 00 ends at its flags
        f"00-{'0' * 32}-{CLIENT_SPAN}-01",
        f"00-{CLIENT_TRACE}-{'0' * 16}-01",
        f"00-{CLIENT_TRACE.upper()}-{CLIENT_SPAN}-01",
    ],
)
def test_a_malformed_traceparent_is_no_parent(value: str | None) -> None:
    assert parse_traceparent(value) is None


def test_a_traceparent_gives_its_ids_and_sampled_flag() -> None:
    parent = parse_traceparent(f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")
    assert parent is not None and parent.sampled
    assert (parent.trace_id, parent.span_id) == (int(CLIENT_TRACE, 16), int(CLIENT_SPAN, 16))
    later = parse_traceparent(f"01-{CLIENT_TRACE}-{CLIENT_SPAN}-00-what-a-later-version-adds")
    assert later is not None and not later.sampled


@pytest.mark.parametrize("ratio", [0.0, 0.25, 1.0])
def test_requests_without_a_parent_are_sampled_at_the_ratio(ratio: float) -> None:
    chosen = tracer(TraceSettings("http://unused", ratio), "t", "s", Kept(), env={})
    try:
        sampled = sum(chosen.start(None) is not None for _ in range(4000))
        client = chosen.start(f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")  # the caller decides
    finally:
        chosen.shutdown()
    assert abs(sampled / 4000 - ratio) < 0.04
    assert client is not None and client.parent_id == int(CLIENT_SPAN, 16)
