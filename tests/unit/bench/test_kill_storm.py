"""The storm with a forced kill: what a request is drawn as, how its end is counted, judged.

The storm itself drives the real launcher, tritonserver and OpenAI frontend for ten
minutes (``python -m tritonforge.bench storm``, committed under perf/results/reliability/);
these pin its bookkeeping fast: a request is either answered, errored, cancelled or hung,
errors are counted by kind and phase without their texts, and a hung or lost request,
a slow recovery or a growing frontend fails the verdict.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter

import pytest

from tritonforge.bench.reliability.clients import Outcome
from tritonforge.bench.reliability.kill_storm import (
    StormSettings,
    StormState,
    counts,
    report,
    verdict,
)
from tritonforge.bench.reliability.storm_requests import (
    FAULTS,
    Draw,
    Ended,
    bounded,
    draw,
    error_kind,
    openai_body,
    sampling,
)
from tritonforge.paths import REPO_ROOT


def _draws(n: int, seed: int = 0) -> list[Draw]:
    rng = random.Random(seed)
    return [draw(rng, ["vllm_model", "ensemble_vllm"], 0.2, 0.05, 6.0) for _ in range(n)]


def test_draws_repeat_with_their_seed_and_hold_the_shares() -> None:
    first, again = _draws(4000), _draws(4000)
    assert first == again
    cancelled = sum(d.cancel_after_s is not None for d in first) / len(first)
    malformed = sum(d.malformed is not None for d in first) / len(first)
    assert 0.18 < cancelled < 0.22
    assert 0.035 < malformed < 0.065
    assert {d.kind for d in first} >= {"grpc_stream", "http_stream", "openai_stream"}
    assert all(0 <= d.cancel_after_s <= 6.0 for d in first if d.cancel_after_s is not None)


def test_every_request_carries_its_deadline_and_a_malformed_one_its_fault() -> None:
    for d in _draws(500):
        values = sampling(d, 600.0)
        if d.malformed is None:
            assert values["timeout_s"] == 600.0
        elif d.malformed in FAULTS:
            fault, _field = FAULTS[d.malformed]
            assert values.items() >= fault.items()
        else:
            assert d.malformed in values  # the misspelt key
    openai = [d for d in _draws(500) if d.kind.startswith("openai")]
    assert all(d.malformed in (None, *FAULTS) for d in openai)  # OpenAI ignores unknown keys
    routes = {openai_body(d, "Hi", 600.0)[0] for d in openai}
    assert routes == {"chat/completions", "completions"}


def _malformed(fault: str = "negative_max_tokens") -> Draw:
    return Draw("http_generate", "vllm_model", 16, True, 0, None, fault)


def _plain() -> Draw:
    return Draw("grpc_stream", "vllm_model", 16, True, 0, None, None)


def test_errors_are_counted_by_kind_without_their_text() -> None:
    kind = error_kind(
        "ClientConnectorError: Cannot connect to host 127.0.0.1:41234 ssl:default", _plain()
    )
    assert kind.startswith("ClientConnectorError: Cannot connect to host")
    assert "41234" not in kind
    assert error_kind("UNAVAILABLE: failed to connect to all addresses", _plain()).startswith(
        "UNAVAILABLE:"
    )
    assert error_kind("no end within 630 s", _plain()) == "hung"
    refused = error_kind("HTTP 400: sampling_parameters.max_tokens: must be >= 1", _malformed())
    assert refused == "malformed, refused naming max_tokens"
    unnamed = error_kind("HTTP 400: something is wrong", _malformed())
    assert unnamed.startswith("malformed: HTTP 400")
    # A malformed request the outage refused was not judged: counted as the outage's.
    assert error_kind("HTTP 503: Triton is not reachable", _malformed()).startswith("HTTP 503")


def test_a_request_is_cancelled_at_its_moment_or_ends_first() -> None:
    async def slow() -> Outcome:
        await asyncio.sleep(5)
        return Outcome("k", "m", True, 5.0)

    async def fast(ok: bool = True, hung: bool = False) -> Outcome:
        return Outcome("k", "m", ok, 0.0, error=None if ok else "HTTP 400: top_p", hung=hung)

    cancel_soon = Draw("grpc_stream", "m", 16, True, 0, 0.05, None)
    assert asyncio.run(bounded(cancel_soon, slow())).state == "cancelled"
    assert asyncio.run(bounded(cancel_soon, fast())).state == "answered"
    assert asyncio.run(bounded(_plain(), fast(ok=False))).state == "errored"
    assert asyncio.run(bounded(_plain(), fast(ok=False, hung=True))).state == "hung"


def _state(records: list[Ended], sent: int, recovery: dict[str, float | None]) -> StormState:
    state = StormState(launcher=None, settings=StormSettings())  # type: ignore[arg-type]
    state.records, state.sent = records, sent
    state.kill = {
        "killed_at": 100.0,
        "killed_at_s": 100.0,
        "launcher_recovery_s": 30.0,
        "recovery": {"seconds": recovery},
    }
    return state


def test_counts_put_errors_in_the_phase_they_ended_in() -> None:
    records = [
        Ended("grpc_stream", "m", "answered", 0, 50),
        Ended("grpc_stream", "m", "errored", 90, 100.5, "UNAVAILABLE: Socket closed"),
        Ended("openai_stream", "m", "errored", 101, 103, "HTTP 503: Triton is not reachable"),
        Ended("http_generate", "m", "errored", 140, 141, "HTTP 400: top_p", "top_p_out_of_range"),
        Ended("grpc_single", "m", "cancelled", 150, 151),
    ]
    c = counts(_state(records, 6, {"http": 30.0, "grpc": 31.0, "openai": 32.0}))
    assert c["lost"] == 1
    assert c["by_state"] == {"answered": 1, "errored": 3, "cancelled": 1}
    assert set(c["errors_by_phase_and_kind"]) == {
        "outage | UNAVAILABLE: Socket closed",
        "outage | HTTP 503: Triton is not reachable",
        "after | HTTP 400: top_p",
    }
    assert c["malformed"] == {"HTTP 400: top_p": 1}


def _figures(**overrides: object) -> dict:
    figures = {
        "counts": {"by_state": {"answered": 10}, "lost": 0, "over_deadline": 0},
        "kill": {
            "launcher_recovery_s": 50.0,
            "recovery": {"seconds": {"http": 60.0, "grpc": 60.0, "openai": 61.0}},
        },
        "ready_line_s": 40.0,
        "cold_start": {"seconds": {"http": 41.0, "grpc": 41.0, "openai": 41.0}},
        "same_process": {"launcher": True, "frontend": True},
        "rss": {
            "launcher": {"growth_after_warmup_pct": 0.1},
            "frontend": {"growth_after_warmup_pct": 1.0},
        },
        "left_after_stop": [],
    }
    return figures | overrides


def test_the_verdict_fails_on_a_hang_a_loss_a_slow_return_or_a_growing_frontend() -> None:
    s = StormSettings()
    assert verdict(_figures(), s) == []
    hung = _figures(counts={"by_state": {"hung": 2}, "lost": 1, "over_deadline": 0})
    assert len(verdict(hung, s)) == 2
    slow = _figures(
        kill={
            "launcher_recovery_s": 71.0,
            "recovery": {"seconds": {"http": 61.0, "grpc": None, "openai": 1.0}},
        }
    )
    assert verdict(slow, s) == [
        "ready again after 71.0 s, cold start 40.0 s (+ 30 s)",
        "grpc: never answered a probe after the kill",
    ]
    rss = _figures(rss={"launcher": {"growth_after_warmup_pct": 0.0}, "frontend": {}})
    assert verdict(rss, s) == ["frontend RSS grew None % after the warm-up"]
    assert verdict(_figures(kill={}), s) == ["tritonserver was not killed: the storm ended first"]


@pytest.mark.parametrize("failures", [[], ["2 request(s) hung"]])
def test_the_report_states_the_verdict_and_the_counts(failures: list[str]) -> None:
    committed = REPO_ROOT / "perf/results/reliability/20261202T133820Z/recovery.json"
    c = counts(_state([Ended("grpc_stream", "m", "answered", 0, 5)], 1, {"http": 3.0}))
    figures = _figures(counts=c) | {
        "kill": {
            "killed_at_s": 300.0,
            "launcher_recovery_s": 45.0,
            "recovery": {"seconds": {"http": 3.0}},
            "first_answer_after_kill_s": {"http": 50.0},
        },
        "load": {
            "foreign_cpu": {
                "before_kill": {
                    "share": 0.25,
                    "busiest_others": ["python (1): 3.0 cpu s"],
                    "seconds": 300.0,
                }
            },
            "load_1m_at_start": 3.0,
            "load_1m_at_end": 9.0,
        },
        "rss": {"frontend": dict.fromkeys(("start_bytes", "after_warmup_bytes"), 2**20)},
        "launcher_exit_code": 0,
        "logs": {
            "launcher_lines": [],
            "server_after_sigterm": [],
            "non_graceful_terminations": 2,
            "response_thread_errors": {},
            "in_flight_at_shutdown": {},
        },
    }
    figures["rss"]["frontend"] |= {"end_bytes": 2**20, "max_bytes": 2**20}
    figures["rss"]["frontend"]["growth_after_warmup_pct"] = 0.0
    result = {
        "started_utc": "20260101T000000Z",
        "command": "python -m tritonforge.bench storm",
        "settings": vars(StormSettings()) | {"models": ["vllm_model"]},
        "figures": json.loads(json.dumps(figures)),
        "failures": failures,
        "environment": json.loads(committed.read_text())["environment"],
    }
    text = report(result)
    assert text.startswith("# Storm with a forced kill") and ("FAIL" in text) == bool(failures)
    assert "hung 0, lost 0" in text and "foreign CPU share 25%" in text
    assert "before kill (300.0 s)" in text
    assert "ready again 45.0 s after the SIGKILL" in text
    assert Counter(line.startswith("- **failed**") for line in text.splitlines())[True] == len(
        failures
    )


def test_the_logs_give_exit_causes_lost_sends_and_what_shutdown_waited_for(tmp_path) -> None:
    from tritonforge.bench.reliability.kill_storm import logs

    (tmp_path / "launcher.log").write_text(
        "tritonforge: tritonserver died (SIGKILL); restart 1 in 1.0 s with models: a, b\n"
        "some other line\n"
    )
    (tmp_path / "server.log").write_text(
        "E1202 12:00:01.1 7 model.py:9] [tritonforge] response thread: RuntimeError('x 12')\n"
        "E1202 12:00:02.1 7 model.py:9] [tritonforge] response thread: RuntimeError('x 13')\n"
        "Non-graceful termination detected.\n"
        'I1202 12:10:00.1 7 server.cc:1] "Signal (15) received."\n'
        "I1202 12:10:01.1 7 server.cc:2] \"Model 'ensemble_vllm' (version 1) has 3 in-flight "
        'inferences"\n'
    )
    found = logs(tmp_path)
    assert found["launcher_lines"] == [
        "tritonforge: tritonserver died (SIGKILL); restart 1 in 1.0 s with models: a, b"
    ]
    assert found["non_graceful_terminations"] == 1
    assert found["response_thread_errors"] == {
        "[tritonforge] response thread: RuntimeError('x N')": 2
    }
    assert list(found["in_flight_at_shutdown"]) == [
        "\"Model 'ensemble_vllm' (version N) has N in-flight inferences\""
    ]
    assert any("has 3 in-flight" in line for line in found["server_after_sigterm"])


def test_carried_over_counts_the_openai_requests_that_had_sent_nothing_at_the_kill() -> None:
    from tritonforge.bench.reliability.kill_storm import carried_over

    deadline = "HTTP 503: tritonserver restarted (it stopped while"
    restarted = "HTTP 200: stream error tritonserver restarted after this"  # as error_kind cuts it
    records = [
        Ended("openai_single", "m", "answered", 90, 140, first_at=140),  # carried over
        Ended("openai_stream", "m", "answered", 95, 141, first_at=135),  # resent stream
        Ended("openai_stream", "m", "errored", 96, 101, restarted, first_at=97),  # started
        Ended("openai_stream", "m", "errored", 98, 120, deadline),  # its deadline passed
        Ended("openai_single", "m", "cancelled", 99, 110),  # the client's own cancel
        Ended("openai_single", "m", "errored", 99, 100.5, "HTTP 400: top_p", "top_p"),
        Ended("openai_single", "m", "errored", 105, 106, "HTTP 503: Triton at N is not"),
        Ended("openai_stream", "m", "answered", 150, 160, first_at=151, duplicated=True),
        Ended("grpc_stream", "m", "errored", 90, 100.5, "UNAVAILABLE: Socket closed"),
    ]
    found = carried_over(_state(records, len(records), {}))
    nothing = found["nothing_sent_at_kill"]
    assert found["in_flight_at_kill"] == 5  # neither the malformed nor Triton's own port
    assert nothing["count"] == 4 and nothing["by_state"]["answered"] == 2
    assert nothing["answered_share"] == round(2 / 3, 4)  # the client's cancel left out
    assert found["streams_started_at_kill"] == {
        "count": 1,
        "by_state": {"errored": 1},
        "ended_by_the_restart_event": 1,
    }
    assert found["duplicated"] == 1
    assert found["errors_from_the_kill_on"] == {
        "allowed": {"started stream ended": 1, "deadline passed": 1},
        "other": {"HTTP 503: Triton at N is not": 1},
    }


def test_the_verdict_holds_the_carry_over_targets() -> None:
    s = StormSettings()
    carried = {
        "killed": True,
        "nothing_sent_at_kill": {"answered_share": 1.0},
        "duplicated": 0,
        "errors_from_the_kill_on": {"allowed": {"deadline passed": 3}, "other": {}},
    }
    assert verdict(_figures(carried_over=carried), s) == []
    worse = carried | {
        "nothing_sent_at_kill": {"answered_share": 0.98},
        "duplicated": 2,
        "errors_from_the_kill_on": {"allowed": {}, "other": {"HTTP 500: x": 1}},
    }
    assert verdict(_figures(carried_over=worse), s) == [
        "98.0% of the OpenAI requests that had sent nothing at the kill were answered "
        "after the restart (target 99%)",
        "2 OpenAI answer(s) given twice",
        "OpenAI errors from the kill on besides the restart's: {'HTTP 500: x': 1}",
    ]


def test_crashes_leave_out_the_storms_own_kill() -> None:
    from tritonforge.bench.reliability.kill_storm import crashes

    assert crashes({"SIGKILL": 1.0}, True, 0) == {
        "stub_aborts": 0,
        "tritonserver_crashes": 0,
        "restarts_by_cause_besides_the_kill": {},
        "abort_lines_in_log": 0,
    }
    found = crashes({"SIGKILL": 1.0, "model stub died": 2.0, "SIGSEGV": 1.0}, True, 3)
    assert found["stub_aborts"] == 2 and found["tritonserver_crashes"] == 1


def test_the_restart_errors_are_recognised_in_the_kinds_the_storm_keeps() -> None:
    from tritonforge.bench.reliability.kill_storm import restart_error
    from tritonforge.openai.carry_over import (
        CarryOverSettings,
        Clock,
        restart_deadline_passed,
        stream_restarted,
        waiting_room_full,
    )

    d = _draws(1)[0]
    clock, settings = Clock(timeout_s=5), CarryOverSettings()
    assert [
        restart_error(
            error_kind(f"HTTP 503: {restart_deadline_passed('m', clock, settings).message}", d)
        ),
        restart_error(error_kind(f"HTTP 503: {waiting_room_full(8).message}", d)),
        restart_error(error_kind(f"HTTP 200: stream error {stream_restarted(3).message}", d)),
    ] == ["deadline passed", "waiting room full", "started stream ended"]


def test_rss_is_judged_per_window_around_the_outage() -> None:
    from tritonforge.bench.reliability.kill_storm import rss_figures

    state = _state([], 0, {})
    state.kill |= {"killed_at_s": 300.0, "serving_again_at_s": 340.0}
    mib = 2**20
    frontend = [(t, 100 * mib) for t in range(60, 300, 20)]  # flat before the kill
    frontend += [(320, 108 * mib)]  # the outage holds the waiting requests
    frontend += [(t, 105 * mib) for t in range(340, 600, 20)]  # flat after it
    state.rss = [
        {"t": t, "frontend": v, "launcher": mib, "tritonserver_group": None} for t, v in frontend
    ]
    found = rss_figures(state)["frontend"]
    assert found["growth_after_warmup_pct"] == 5.0
    assert found["growth_in_windows_pct"] == {"before_kill": 0.0, "after_serving_again": 0.0}
    assert found["growth_judged_pct"] == 0.0
