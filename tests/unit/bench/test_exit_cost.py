"""The exit-cost suite's checks and pairwise changes on recorded replies, no server.

Replies are shaped as the servers send them (OpenAI's chat completion and SSE chunks);
each test changes the one thing its check judges.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tritonforge.bench.exit_cost import changes, checks
from tritonforge.bench.exit_cost.results import CheckResult, SuiteResult
from tritonforge.bench.exit_cost.transport import Reply, read_sse

SUITE = checks.Suite(model="m", metrics_url="http://h/metrics", adapter=None, probe_tokens=4)
Handler = Callable[[str, dict[str, Any], int | None], Reply]


class Replay:
    """A transport answering from a function of the request; it keeps what was sent."""

    def __init__(self, post: Handler, metrics: str = "") -> None:
        self.handler, self.metrics, self.sent = post, metrics, []

    def post(self, path: str, body: dict[str, Any], max_events: int | None = None) -> Reply:
        self.sent.append(body)
        return self.handler(path, body, max_events)

    def get(self, url: str) -> Reply:
        return Reply(200, text=self.metrics) if self.metrics else Reply(404, text="not found")


def chat(content: str | None, finish: str = "stop", usage: dict | None = None, **message) -> Reply:
    body = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, **message},
                "finish_reason": finish,
            }
        ],
        "usage": {"prompt_tokens": 30, "completion_tokens": 3, "total_tokens": 33}
        if usage is None
        else usage,
    }
    return Reply(200, body)


def chunks(pieces: list[str], finish: str | None, usage: dict | None = None) -> Reply:
    events: list[dict] = [
        {"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces
    ]
    if finish:
        events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    if usage:
        events.append({"choices": [], "usage": usage})
    return Reply(200, events=events, done=True)


def test_sse_reading_stops_at_done_or_at_the_clients_budget() -> None:
    lines = [b'data: {"choices": []}', b"", b": keep-alive", b'data: {"a": 1}', b"data: [DONE]"]
    whole = read_sse(200, iter(lines), None)
    assert (len(whole.events), whole.done, whole.cut) == (2, True, False)
    cut = read_sse(200, iter(lines), 1)
    assert (len(cut.events), cut.done, cut.cut) == (1, False, True)


def test_chat_template_records_the_prompt_tokens_and_fails_without_usage() -> None:
    passed = checks.chat_template(Replay(lambda *_: chat("x", usage={"prompt_tokens": 41})), SUITE)
    assert (passed.status, passed.behaviour) == ("passed", {"prompt_tokens": 41})
    missing = checks.chat_template(Replay(lambda *_: chat("x", usage={})), SUITE)
    assert missing.status == "failed"


def test_a_4xx_is_unsupported_and_a_5xx_a_failure() -> None:
    refused = Reply(400, {"error": {"message": "response_format: not supported"}})
    result = checks.json_schema(Replay(lambda *_: refused), SUITE)
    assert result.status == "unsupported" and "response_format" in result.evidence["error"]
    crashed = checks.json_schema(Replay(lambda *_: Reply(500, text="boom")), SUITE)
    assert crashed.status == "failed"


def test_default_max_tokens_tells_a_bound_from_an_unbounded_stream() -> None:
    def bounded(path, body, max_events):
        assert "max_tokens" not in body
        return chunks(["1", "2"], "length")

    assert checks.default_max_tokens(Replay(bounded), SUITE).behaviour == {
        "default_bound": "bounded (finish_reason length after 2 chunks)"
    }
    endless = Reply(200, events=[chunks(["n"], None).events[0]] * 5, cut=True)
    result = checks.default_max_tokens(Replay(lambda *_: endless), SUITE)
    assert result.behaviour == {"default_bound": "no bound within 4 chunks"}
    stopped = checks.default_max_tokens(Replay(lambda *_: chunks(["a"], "stop")), SUITE)
    assert stopped.behaviour["default_bound"] == "not seen (the model stopped first)"


def test_default_temperature_compares_the_servers_answers_with_its_greedy_one() -> None:
    answers = iter(["a b", "a c", "a b"])

    def sampled(path, body, max_events):
        return chat("a b") if body.get("temperature") == 0 else chat(next(answers))

    result = checks.default_temperature(Replay(sampled), SUITE)
    assert result.behaviour == {"default": "sampled"} and result.evidence["equal_to_greedy"] == 2
    greedy = checks.default_temperature(Replay(lambda *_: chat("same")), SUITE)
    assert greedy.behaviour == {"default": "greedy"}


def test_stop_string_from_the_servers_own_answer_must_cut_before_it() -> None:
    text = "The sea is wide and deep."

    def honoured(path, body, max_events):
        if "stop" not in body:
            return chat(text)
        stop = body["stop"][0]
        return chat(text[: text.find(stop)], "stop")

    assert checks.stop_sequence(Replay(honoured), SUITE).status == "passed"

    def included(path, body, max_events):
        if "stop" not in body:
            return chat(text)
        stop = body["stop"][0]
        return chat(text[: text.find(stop)] + stop, "stop")

    result = checks.stop_sequence(Replay(included), SUITE)
    assert result.status == "failed" and result.behaviour["stop_included"] is True
    ignored = checks.stop_sequence(Replay(lambda *_: chat(text, "length")), SUITE)
    assert ignored.status == "failed" and ignored.behaviour["stop_included"] is False
    short = checks.stop_sequence(Replay(lambda *_: chat("Hi")), SUITE)
    assert short.status == "not run"


def test_json_schema_output_must_parse_and_validate() -> None:
    good = checks.json_schema(Replay(lambda *_: chat('{"answer":"yes","confidence":2}')), SUITE)
    assert good.status == "passed"
    outside = checks.json_schema(
        Replay(lambda *_: chat('{"answer":"maybe","confidence":2}')), SUITE
    )
    assert outside.status == "failed" and "outside the schema" in outside.summary
    cut = checks.json_schema(Replay(lambda *_: chat('{"answer":"ye', "length")), SUITE)
    assert cut.status == "failed" and "not JSON" in cut.summary


def call(name: str = "get_weather", arguments: Any = None, **fields) -> dict:
    args = json.dumps({"city": "Paris", "unit": "celsius"}) if arguments is None else arguments
    return {
        "id": "call_1",
        "type": "function",
        "function": {"name": name, "arguments": args},
    } | fields


def test_tool_call_shape_is_judged_not_its_words() -> None:
    ok = checks.tool_call(Replay(lambda *_: chat(None, "tool_calls", tool_calls=[call()])), SUITE)
    assert ok.status == "passed"
    assert ok.behaviour == {"finish_reason": "tool_calls", "content": "null"}
    for broken, fault in (
        ([call(arguments={"city": "Paris"})], "not a JSON string"),
        ([call(arguments='{"city": "Lima", "unit": "celsius"}')], "invalid under"),
        ([call(name="other")], "function name"),
        ([call(type="tool")], "type 'tool'"),
        ([], "no tool_calls"),
    ):
        result = checks.tool_call(Replay(lambda *_, b=broken: chat("", tool_calls=b)), SUITE)
        assert result.status == "failed" and fault in result.summary


def test_stream_usage_wants_one_last_chunk_with_no_choices() -> None:
    usage = {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
    good = checks.stream_usage(Replay(lambda *_: chunks(["a", "b"], "length", usage)), SUITE)
    assert good.status == "passed"
    none = checks.stream_usage(Replay(lambda *_: chunks(["a", "b"], "length")), SUITE)
    assert none.status == "failed" and "no usage" in none.summary
    inline = chunks(["a"], "length")
    inline.events[-1]["usage"] = usage
    assert "carries choices" in checks.stream_usage(Replay(lambda *_: inline), SUITE).summary


def test_an_adapter_is_not_run_without_a_name_and_asked_by_model_name_with_one() -> None:
    assert checks.adapter(Replay(lambda *_: chat("x")), SUITE).status == "not run"
    replay = Replay(lambda *_: chat("x"))
    named = checks.adapter(replay, checks.Suite(model="m", adapter="smol-alpha"))
    assert named.status == "passed" and replay.sent[0]["model"] == "smol-alpha"


VLLM_METRICS = """# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created 1.7e9
# HELP vllm:num_requests_running Requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 0.0
vllm:num_requests_waiting{model_name="m"} 0.0
vllm:kv_cache_usage_perc{model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{le="0.1"} 1
vllm:time_per_output_token_seconds_count 1
vllm:e2e_request_latency_seconds_count 1
vllm:prompt_tokens_total 5
vllm:generation_tokens_total 5
"""


def test_metrics_maps_every_dashboard_signal_to_families() -> None:
    result = checks.metrics(Replay(lambda *_: chat("x"), VLLM_METRICS), SUITE)
    assert result.status == "passed"
    assert result.behaviour["signals"]["requests running"] == ["vllm:num_requests_running"]
    assert result.behaviour["signals"]["prompt tokens"] == ["vllm:prompt_tokens_total"]
    partial = "llamacpp:requests_processing 1\nllamacpp:prompt_tokens_total 3\n"
    missing = checks.metrics(Replay(lambda *_: chat("x"), partial), SUITE)
    assert missing.status == "failed" and "time to first token" in missing.summary
    absent = checks.metrics(Replay(lambda *_: chat("x")), SUITE)
    assert absent.status == "unsupported"


def test_a_check_that_raises_is_recorded_failed_and_the_rest_still_run() -> None:
    def broken(path, body, max_events):
        raise ConnectionError("reset")

    results = checks.run_all(Replay(broken, VLLM_METRICS), SUITE)
    assert [r.check for r in results] == list(checks.CHECKS)
    assert results[0].status == "failed" and "ConnectionError" in results[0].summary
    assert next(r for r in results if r.check == "metrics").status == "passed"


def result(name: str, *found: CheckResult) -> SuiteResult:
    return SuiteResult(
        candidate=name, base_url="u", model="m", started_at="s", finished_at="f", checks=list(found)
    )


def test_a_move_costs_what_passed_before_and_differs_or_fails_after() -> None:
    a = result(
        "a",
        CheckResult(
            check="chat_template", status="passed", summary="", behaviour={"prompt_tokens": 30}
        ),
        CheckResult(check="json_schema", status="passed", summary="", behaviour={"valid": True}),
        CheckResult(check="adapter", status="unsupported", summary="404"),
        CheckResult(check="stop_sequence", status="passed", summary="", behaviour={"x": 1}),
    )
    b = result(
        "b",
        CheckResult(
            check="chat_template", status="passed", summary="", behaviour={"prompt_tokens": 34}
        ),
        CheckResult(check="json_schema", status="unsupported", summary="HTTP 400"),
        CheckResult(check="adapter", status="passed", summary=""),
        CheckResult(check="stop_sequence", status="passed", summary="", behaviour={"x": 1}),
    )
    moves = dict(changes.changes(a, b))
    assert set(moves) == {"chat_template", "json_schema"}  # a's unsupported adapter costs nothing
    assert "30 → 34" in moves["chat_template"] and "+4" in moves["chat_template"]
    assert "unsupported" in moves["json_schema"]
    back = dict(changes.changes(b, a))
    assert set(back) == {"chat_template", "adapter"}
    report = changes.report([a, b])
    assert "### Written against a, moving to b" in report and "| a | – | 2 |" in report


def test_dashboard_changes_name_the_families_to_query_instead() -> None:
    before = {"signals": {"requests running": ["vllm:num_requests_running"]}}
    after = {"signals": {"requests running": ["llamacpp:requests_processing", "x_created"]}}
    text = changes.behaviour_change("metrics", before, after)
    assert text == (
        "rewrite dashboard queries — requests running: "
        "vllm:num_requests_running → llamacpp:requests_processing"
    )
    extra = {"signals": {"requests running": ["vllm:num_requests_running", "sglang:x"]}}
    assert changes.behaviour_change("metrics", before, extra) is None  # more costs nothing


def test_a_behaviour_change_names_only_what_moved() -> None:
    text = changes.behaviour_change(
        "tool_call",
        {"finish_reason": "stop", "content": "null"},
        {"finish_reason": "tool_calls", "content": "null"},
    )
    assert text is not None and "finish_reason 'stop' → 'tool_calls'" in text
    assert "content" not in text
