"""SLO admission: the predictor and the rule, replayed on engine timelines (no server).

``data/vllm_timeline.json`` was recorded from vllm_model under open-loop Poisson
arrivals (perf/record_timeline.py): each request's arrival, prompt tokens and the time
of every token. Replaying it through :class:`Admission` with the timeline's clock shows
what the predictor learns from a real engine; small hand-made timelines pin the rule.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from tritonforge.serving.admission import (
    ADMITTED,
    DECISIONS,
    MAX_STEP_ELAPSED_S,
    NO_SLO,
    RATIO_MAX_AGE_S,
    REFUSED_TPOT,
    REFUSED_TTFT,
    Admission,
    AdmissionSettings,
    LatencyPredictor,
    SloUnattainable,
    model_defaults,
)
from tritonforge.serving.errors import EngineBusy, RequestError
from tritonforge.serving.sampling import SamplingParams

TIMELINE = Path(__file__).parent / "data" / "vllm_timeline.json"
#: Recorded on a 2-core AMD EPYC at 4 req/s, the overload contract's saturation rate there.
TIMELINE_AT_S = Path(__file__).parent / "data" / "vllm_timeline_4rps.json"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replay(
    timeline: list[dict],
    admission: Admission,
    clock: Clock,
    sampling: SamplingParams | None = None,
) -> int:
    """Feed a recorded timeline's events to ``admission`` in time order, each request
    with ``sampling`` (none: no SLO), screened and admitted as the runtime does.

    Returns how many were refused; a refused request's tokens are ignored, as admission
    ignores any request it does not track.
    """
    sampling = sampling or SamplingParams()
    refused = 0
    events: list[tuple[float, int, str, int]] = []  # time, order, request id, tokens
    for i, row in enumerate(timeline):
        events.append((row["arrival"], 0, f"r{i}", row["prompt_tokens"]))
        for t in row["token_times"]:
            events.append((t, 1, f"r{i}", 1))
        events.append((row["token_times"][-1], 2, f"r{i}", 0))
    for when, kind, request_id, value in sorted(events):
        clock.now = when
        if kind == 0:
            try:
                admission.screen(sampling)
                admission.admit(request_id, value, sampling)
            except SloUnattainable:
                refused += 1
        elif kind == 1:
            admission.saw_tokens(request_id, value)
        else:
            admission.release(request_id)
    return refused


def recorded() -> list[dict]:
    return json.loads(TIMELINE.read_text())["requests"]


# --- the predictor on a real engine's timeline -------------------------------------


def test_replayed_vllm_timeline_calibrates_prefill_and_decode() -> None:
    clock = Clock()
    admission = Admission(AdmissionSettings(mode="observe"), clock=clock)
    replay(recorded(), admission, clock)
    predictor = admission.predictor
    assert predictor.samples == len(recorded())
    assert predictor.prefill_s_per_token is not None and predictor.prefill_s_per_token > 0
    assert predictor.step_s and all(s > 0 for s in predictor.step_s.values())


def test_ttft_prediction_error_on_the_recorded_timeline_is_reported() -> None:
    """Every request admitted with a prediction leaves one error sample for the metrics.

    The recorded timeline is a deeply overloaded two-core host (TTFT p50 29 s, decode
    steps of 0.3-4 s as other work came and went, TTFTs of 21-42 s whether 600 or 5,000
    prompt tokens were queued ahead): little here is predictable. The median error after
    the first third is 0.48 (0.60 before the prediction counted the step in progress and
    weighted the line's points by relative error; 0.32 with the step looked up per size,
    which refused requests on quiet timelines that met their SLO: see the tests below).
    The contract's 20 % target is judged by perf/contracts/overload.yaml on a quiet host;
    this test holds the replay to 0.7.
    """
    clock = Clock()
    admission = Admission(AdmissionSettings(mode="observe"), clock=clock)
    replay(recorded(), admission, clock)
    errors = admission.snapshot().ttft_errors
    # the requests that arrived before any first token had nothing to go on
    assert len(recorded()) - 3 <= len(errors) < len(recorded())
    assert statistics.median(errors[len(errors) // 3 :]) < 0.7
    assert admission.snapshot().ttft_errors == []  # drained by the first snapshot


def test_a_request_behind_the_recorded_queue_with_a_tight_slo_is_refused() -> None:
    clock = Clock()
    admission = Admission(AdmissionSettings(mode="on", min_samples=4), clock=clock)
    rows = recorded()
    replay(rows[:20], admission, clock)
    for i in range(8):  # a burst of long prompts queues prefill work
        admission.admit(f"burst{i}", 300, SamplingParams())
    with pytest.raises(SloUnattainable, match=r"predicted TTFT \d+ ms exceeds slo_ttft_ms 50 ms"):
        admission.admit("urgent", 100, SamplingParams(slo_ttft_ms=50))
    admission.admit("patient", 100, SamplingParams())  # no SLO: never refused by this rule
    snapshot = admission.snapshot()
    assert snapshot.decisions[REFUSED_TTFT] == 1
    assert snapshot.decisions[NO_SLO] >= 1


def test_the_prefill_line_learns_a_fixed_cost_beside_the_cost_per_token() -> None:
    """First tokens that cost 50 ms whatever the prompt plus 1 ms a token: the line finds
    both, so a short prompt is not predicted as if the 50 ms were spread over tokens."""
    predictor = LatencyPredictor(alpha=0.2)
    predictor.observe_step(1, 0.1)
    for i in range(200):
        tokens = 20 + (i * 37) % 380
        predictor.observe_first_token(tokens, 0.05 + 0.001 * tokens + 0.1, batch=1)
    assert predictor.prefill_fixed_s == pytest.approx(0.05, rel=1e-6)
    assert predictor.prefill_s_per_token == pytest.approx(0.001, rel=1e-6)
    assert predictor.ttft(20, 1) == pytest.approx(0.05 + 0.02 + 0.1, rel=1e-6)


def test_the_part_of_the_step_already_run_is_not_waited_for_again() -> None:
    """First tokens timed from the start of the engine's step: a request that arrived
    ``elapsed`` into it saw a TTFT that much shorter. The line is learnt from the step's
    start, and a prediction takes off what has run of the step in progress."""
    predictor = LatencyPredictor(alpha=0.2)
    predictor.observe_step(1, 0.1)
    for i in range(200):
        tokens, elapsed = 20 + (i * 37) % 380, (i * 0.013) % 0.09
        predictor.observe_first_token(tokens, 0.05 + 0.001 * tokens + 0.1 - elapsed, 1, elapsed)
    assert predictor.prefill_fixed_s == pytest.approx(0.05, rel=1e-6)
    assert predictor.prefill_s_per_token == pytest.approx(0.001, rel=1e-6)
    assert predictor.ttft(100, 1, elapsed_s=0.04) == pytest.approx(0.15 - 0.04 + 0.1, rel=1e-6)
    # more run than the prefill itself takes: the step alone is left
    assert predictor.ttft(10, 1, elapsed_s=0.5) == pytest.approx(0.1)


def test_admission_counts_the_time_since_the_last_step_while_requests_decode() -> None:
    """The prediction a refusal names: 100 prompt tokens at 1 ms and a 50 ms step, less
    what has run of the step in progress once a request decodes."""
    clock = Clock()
    admission = Admission(AdmissionSettings(mode="on", min_samples=1), clock=clock)
    admission.predictor.prefill_s_per_token = 0.001
    admission.predictor.step_s = {1: 0.05}
    admission.predictor.samples = 10
    urgent = SamplingParams(slo_ttft_ms=1)

    def predicted_ms() -> str:
        with pytest.raises(SloUnattainable) as refused:
            admission.admit("urgent", 100, urgent)
        return re.search(r"predicted TTFT (\d+) ms", str(refused.value)).group(1)

    admission.admit("first", 100, SamplingParams())
    # nothing decodes yet: the 100 tokens queued ahead count, no step is under way
    assert predicted_ms() == "250"
    clock.now = 0.15
    admission.saw_tokens("first", 1)  # as predicted; a step ended and "first" decodes now
    clock.now = 0.18
    assert predicted_ms() == "120"  # 100 ms of prefill less the 30 ms run, then the step
    clock.now = 5.0  # a stall: no more than MAX_STEP_ELAPSED_S counts as run
    assert MAX_STEP_ELAPSED_S < 4.8
    assert predicted_ms() == "50"


def test_prompts_all_alike_give_a_cost_per_token_alone() -> None:
    predictor = LatencyPredictor(alpha=0.2)
    for _ in range(10):
        predictor.observe_first_token(100, 0.2, batch=1)  # no step seen: all of it prefill
    assert predictor.prefill_fixed_s == 0.0
    assert predictor.prefill_s_per_token == pytest.approx(0.002)


def test_near_saturation_the_median_ttft_error_is_within_20_percent() -> None:
    """At the rate the overload contract calls saturation, TTFTs of 0.1-0.3 s: the
    median error after the first 100 requests is 0.125. It was 0.153 before the
    prediction took off the part of the step in progress already run and weighted the
    line's points by relative error (each alone: 0.152 and 0.176), and 0.170 with a
    cost per token alone, without the line's fixed cost. The contract's target is 20 %."""
    clock = Clock()
    admission = Admission(AdmissionSettings(mode="observe"), clock=clock)
    replay(json.loads(TIMELINE_AT_S.read_text())["requests"], admission, clock)
    errors = admission.snapshot().ttft_errors
    assert len(errors) > 200
    assert statistics.median(errors[100:]) < 0.15


def test_at_saturation_requests_that_met_their_slo_are_not_refused() -> None:
    """On the timeline recorded at the contract's saturation rate every request met a
    2 s TTFT and a 150 ms TPOT (TPOT p95 78 ms). Replayed with those SLOs and admission
    on, none is refused: below its limits the engine keeps every promise itself. (With
    the step looked up per batch size, noisy sizes refused 50 of the 240.)"""
    rows = json.loads(TIMELINE_AT_S.read_text())["requests"]
    for row in rows:  # the premise: each request met both SLOs when recorded
        times = row["token_times"]
        assert times[0] - row["arrival"] <= 2.0
        assert (times[-1] - times[0]) / max(len(times) - 1, 1) <= 0.150
    clock = Clock()
    admission = Admission(AdmissionSettings(mode="on"), clock=clock)
    slo = SamplingParams(slo_ttft_ms=2000, slo_tpot_ms=150)
    assert replay(rows, admission, clock, slo) == 0
    assert admission.snapshot().decisions[ADMITTED] == len(rows)


# --- the rule on hand-made timelines ------------------------------------------------


def calibrated(mode: str = "on", step_s: float = 0.05, per_token_s: float = 0.001) -> Admission:
    admission = Admission(AdmissionSettings(mode=mode, min_samples=1, margin=0.1))
    admission.predictor.prefill_s_per_token = per_token_s
    admission.predictor.step_s = {1: step_s, 4: step_s * 2}
    admission.predictor.samples = 10
    return admission


def test_prediction_counts_the_prefill_queued_ahead() -> None:
    admission = calibrated()
    admission.admit("a", 1000, SamplingParams())
    # ahead 1000 + own 100 tokens at 1 ms, plus a step at batch 1 (nothing decoding yet)
    assert admission.predictor.ttft(1100, 1) == pytest.approx(1.1 + 0.05)
    with pytest.raises(SloUnattainable) as refused:
        admission.admit("b", 100, SamplingParams(slo_ttft_ms=1000))
    assert isinstance(refused.value, EngineBusy)  # the edge answers UNAVAILABLE
    assert "slo_ttft_ms 1000 ms" in str(refused.value) and "predicted TTFT 1150 ms" in str(
        refused.value
    )
    assert refused.value.retry_after_s >= 1


def test_margin_keeps_a_reserve_of_the_slo() -> None:
    admission = calibrated()  # predicted 0.15 s for 100 tokens
    admission.admit("fits", 100, SamplingParams(slo_ttft_ms=200))
    admission.release("fits")
    with pytest.raises(SloUnattainable):  # 150 ms > 160 ms * 0.9
        admission.admit("tight", 100, SamplingParams(slo_ttft_ms=160))


def test_joining_a_batch_that_would_break_a_running_tpot_slo_is_refused() -> None:
    admission = calibrated(step_s=0.05)  # step: 50 ms at 1, 100 ms at 4, linear between
    admission.admit("running", 10, SamplingParams(slo_tpot_ms=80))
    admission.saw_tokens("running", 1)
    admission.admit("second", 10, SamplingParams(slo_ttft_ms=5000))  # step(2) = 66.7 ms
    admission.saw_tokens("second", 1)
    with pytest.raises(SloUnattainable, match="predicted TPOT 83 ms exceeds slo_tpot_ms 80"):
        admission.admit("third", 10, SamplingParams(slo_ttft_ms=5000))
    assert admission.snapshot().decisions[REFUSED_TPOT] == 1
    admission.admit("no-slo", 10, SamplingParams())  # never refused by this rule


def test_screen_applies_the_tpot_rule_before_the_prompt_is_known() -> None:
    admission = calibrated(step_s=0.05)
    for name in ("running", "second"):  # a batch of two; the third makes step(3) = 83 ms
        admission.admit(name, 10, SamplingParams(slo_tpot_ms=80))
        admission.saw_tokens(name, 1)
    with pytest.raises(SloUnattainable, match="predicted TPOT 83 ms exceeds slo_tpot_ms 80"):
        admission.screen(SamplingParams(slo_ttft_ms=5000))
    admission.screen(SamplingParams())  # no SLO: never refused by this rule
    assert admission.snapshot().decisions == {
        "admitted": 2,
        "no_slo": 0,
        "refused_ttft": 0,
        "refused_tpot": 1,  # counted once, by the screen: the request never reached admit
    }
    admission.release("second")  # step(2) = 67 ms fits: screened through, then admitted
    admission.screen(SamplingParams(slo_ttft_ms=5000))
    admission.admit("third", 10, SamplingParams(slo_ttft_ms=5000))
    assert admission.snapshot().decisions["admitted"] == 3


def test_screen_refuses_nothing_before_calibration_or_when_observing() -> None:
    tight = SamplingParams(slo_tpot_ms=1)
    cold = Admission(AdmissionSettings(mode="on", min_samples=3))
    cold.predictor.step_s = {1: 0.05}
    cold.screen(tight)
    watching = calibrated(mode="observe")
    watching.screen(tight)
    assert cold.snapshot().decisions == watching.snapshot().decisions == dict.fromkeys(DECISIONS, 0)


def test_nothing_is_refused_before_calibration_or_when_observing() -> None:
    cold = Admission(AdmissionSettings(mode="on", min_samples=3))
    for i in range(5):
        cold.admit(f"r{i}", 2000, SamplingParams(slo_ttft_ms=1))
    watching = calibrated(mode="observe")
    watching.admit("big", 10_000, SamplingParams())
    watching.admit("tight", 100, SamplingParams(slo_ttft_ms=1))
    assert watching.snapshot().decisions[ADMITTED] == 1


def test_a_refused_request_leaves_no_trace_and_a_released_one_frees_its_work() -> None:
    admission = calibrated()
    admission.admit("a", 5000, SamplingParams())
    with pytest.raises(SloUnattainable):
        admission.admit("b", 10, SamplingParams(slo_ttft_ms=100))
    admission.release("a")
    admission.admit("b", 10, SamplingParams(slo_ttft_ms=100))  # the queue is gone


def test_reset_forgets_the_calibration() -> None:
    admission = calibrated()
    admission.reset()
    assert admission.predictor.samples == 0 and admission.predictor.ttft(10, 1) is None


def test_step_time_is_a_line_over_the_sizes_seen() -> None:
    predictor = LatencyPredictor()
    assert predictor.step(3) is None
    predictor.observe_step(2, 0.1)
    assert predictor.step(8) == pytest.approx(0.1)  # one size: at least that
    predictor.observe_step(4, 0.2)
    assert predictor.step(3) == pytest.approx(0.15)
    assert predictor.step(6) == pytest.approx(0.3)
    assert predictor.step(1) == pytest.approx(0.05)


def test_one_noisy_size_does_not_make_its_own_prediction() -> None:
    """Steps of 30 + 2 ms per running request, except that batch 6's few steps caught a
    prefill (97 ms, as on a recorded timeline): a request joining five is judged on
    the line through all sizes, not on that one entry; and a bigger batch never
    predicts a faster step."""
    predictor = LatencyPredictor(alpha=0.2)
    for _ in range(10):
        for batch in (1, 2, 3, 4, 5, 7, 8):
            predictor.observe_step(batch, 0.030 + 0.002 * batch)
    predictor.observe_step(6, 0.097)
    assert predictor.step(6) < 0.06
    assert predictor.step(12) == pytest.approx(0.054, abs=0.01)
    falling = LatencyPredictor()
    falling.observe_step(1, 0.08)
    falling.observe_step(8, 0.04)
    assert falling.step(16) == pytest.approx(falling.step(1))


def test_a_step_is_observed_once_however_many_requests_it_served() -> None:
    """Eight running requests each see every step; each sighting weighs 1/8, so one slow
    step (a prompt prefilled beside the decodes) moves the estimate like one step, not
    eight: the average step, which a TPOT SLO is about, stays where the steps put it."""
    clock = Clock()
    admission = Admission(AdmissionSettings(mode="observe", alpha=0.2), clock=clock)
    ids = [f"r{i}" for i in range(8)]
    for request_id in ids:
        admission.admit(request_id, 10, SamplingParams())

    def step(at: float) -> None:
        for i, request_id in enumerate(ids):
            clock.now = at + 0.0001 * i
            admission.saw_tokens(request_id, 1)

    at = 0.0
    for _ in range(12):  # first tokens, then 11 steps of 50 ms
        step(at)
        at += 0.05
    assert admission.predictor.step_s[8] == pytest.approx(0.05, abs=1e-3)
    step(at + 0.25)  # one step of 300 ms
    once = 0.05 + 0.2 * 0.25  # what one observation at alpha 0.2 would give
    assert admission.predictor.step_s[8] == pytest.approx(once, rel=0.1)


def test_snapshot_exports_counters_and_the_typical_prediction() -> None:
    exported = []
    admission = Admission(AdmissionSettings(mode="observe"), exporter=exported.append)
    admission.predictor.prefill_s_per_token = 0.002
    admission.admit("a", 10, SamplingParams(slo_ttft_ms=100))
    admission.export()
    (snapshot,) = exported
    assert snapshot.decisions[ADMITTED] == 1
    assert snapshot.typical_ttft_s == pytest.approx((10 + 256) * 0.002)


# --- settings and model defaults -----------------------------------------------------


def keep_busy(admission: Admission) -> None:
    """One request decoding, without an SLO: the engine is not idle, so predictions
    are scaled."""
    admission.admit("busy", 10, SamplingParams(max_tokens=1000))
    admission.saw_tokens("busy", 1)


def running_late(quantile: float) -> Admission:
    """A predictor fixed at 150 ms for a 100-token prompt (1 ms a token, 50 ms a step)
    whose last 20 requests all had their first token at 300 ms: twice the prediction;
    one request still decoding."""
    clock = Clock()
    settings = AdmissionSettings(
        mode="on", min_samples=4, margin=0.0, alpha=1e-9, quantile=quantile
    )
    admission = Admission(settings, clock=clock)
    predictor = admission.predictor
    predictor.prefill_s_per_token, predictor.step_s, predictor.samples = 0.001, {1: 0.05}, 10
    for i in range(20):
        admission.admit(f"r{i}", 100, SamplingParams())
        clock.now += 0.3
        admission.saw_tokens(f"r{i}", 1)
        admission.release(f"r{i}")
    keep_busy(admission)
    return admission


def test_a_prediction_is_scaled_by_how_far_actual_ttfts_ran_over_it() -> None:
    """A p95 promise needs the prediction's error, not only its average: requests that
    ran at twice their prediction make the next one count at twice its own."""
    admission = running_late(quantile=0.95)
    admission.admit("fits", 100, SamplingParams(slo_ttft_ms=400))  # 2 x 150 ms <= 400
    admission.release("fits")
    with pytest.raises(SloUnattainable, match="predicted TTFT 300 ms exceeds slo_ttft_ms 250"):
        admission.admit("tight", 100, SamplingParams(slo_ttft_ms=250))  # 150 ms alone fits


def test_the_step_is_scaled_by_how_far_requests_mean_tpot_ran_over_it() -> None:
    """Requests alone on the engine were predicted 50 ms a step and got 100 ms a token:
    the next one's step counts at 100 ms against its TPOT SLO."""
    clock = Clock()
    settings = AdmissionSettings(mode="on", min_samples=4, margin=0.0, alpha=1e-9)
    admission = Admission(settings, clock=clock)
    predictor = admission.predictor
    predictor.prefill_s_per_token, predictor.step_s, predictor.samples = 1e-4, {1: 0.05}, 10
    for i in range(6):
        admission.admit(f"r{i}", 10, SamplingParams())
        for _ in range(5):
            clock.now += 0.1
            admission.saw_tokens(f"r{i}", 1)
        admission.release(f"r{i}")
    keep_busy(admission)
    admission.admit("loose", 10, SamplingParams(slo_tpot_ms=120))  # 2 x 50 ms fits
    admission.release("loose")
    with pytest.raises(SloUnattainable, match="predicted TPOT 100 ms exceeds slo_tpot_ms 80"):
        admission.admit("tight", 10, SamplingParams(slo_tpot_ms=80))  # 50 ms alone fits


def test_a_batch_that_grew_after_a_request_joined_is_not_counted_as_error() -> None:
    """Eight requests joined an idle engine (step 20 ms predicted at batch 1) and decoded
    together at 100 ms, as predicted for batch 8: the step predictor was right. The next
    request joining three must be judged on step(4), not on step(4) x 5 — that scale
    refused every request at half the saturation rate, and with nothing admitted nothing
    finished to bring it down."""
    clock = Clock()
    settings = AdmissionSettings(mode="on", min_samples=4, margin=0.1, alpha=1e-9)
    admission = Admission(settings, clock=clock)
    predictor = admission.predictor
    predictor.prefill_s_per_token, predictor.samples = 1e-4, 10
    predictor.step_s = {1: 0.02, 8: 0.1}
    batch = [f"r{i}" for i in range(8)]
    for request_id in batch:
        admission.admit(request_id, 10, SamplingParams(slo_tpot_ms=150))
    clock.now = 0.5
    for request_id in batch:
        admission.saw_tokens(request_id, 1)
    for _ in range(5):
        clock.now += 0.1
        for request_id in batch:
            admission.saw_tokens(request_id, 1)
    for request_id in batch:
        admission.release(request_id)
    for request_id in ("a", "b", "c"):
        admission.admit(request_id, 10, SamplingParams())
        admission.saw_tokens(request_id, 1)
    admission.admit("joiner", 10, SamplingParams(slo_tpot_ms=150))  # step(4) ~ 54 ms
    assert admission.snapshot().decisions[REFUSED_TPOT] == 0


def test_an_idle_engine_judges_its_prediction_unscaled() -> None:
    """Requests ran at twice their prediction, then everything finished: a request to
    the idle engine is judged on its own prediction (150 ms fits 250 ms). Scaled, it and
    every request after it would be refused, and with nothing admitted no ratio could
    ever come back down."""
    admission = running_late(quantile=0.95)
    admission.release("busy")
    admission.admit("alone", 100, SamplingParams(slo_ttft_ms=250))
    assert admission.snapshot().decisions[REFUSED_TTFT] == 0


def test_ratios_older_than_their_window_no_longer_scale() -> None:
    admission = running_late(quantile=0.95)
    clock = admission._clock
    assert isinstance(clock, Clock)
    clock.now += RATIO_MAX_AGE_S + 1
    admission.admit("later", 100, SamplingParams(slo_ttft_ms=250))  # 150 ms, unscaled
    assert admission.snapshot().decisions[REFUSED_TTFT] == 0


def full_engine(capacity: int = 2) -> tuple[Admission, Clock]:
    """Two slots, both decoding requests of 100 tokens that have 40 and 80 left; a
    step of 30 ms, prefill 1 ms a token."""
    clock = Clock()
    settings = AdmissionSettings(mode="on", min_samples=1, margin=0.0, quantile=0.0)
    admission = Admission(settings, clock=clock, capacity=lambda: capacity)
    for request_id, done in (("a", 60), ("b", 20)):
        admission.admit(request_id, 10, SamplingParams(max_tokens=101))
        admission.saw_tokens(request_id, 1)
        admission.saw_tokens(request_id, done)
    admission.predictor = LatencyPredictor(prefill_s_per_token=0.001, step_s={2: 0.03}, samples=10)
    return admission, clock


def test_a_request_finding_every_slot_taken_waits_for_the_first_to_free() -> None:
    """The first slot frees after 40 steps (1.2 s); then the request's own prefill
    (100 ms) and a step (30 ms): 1.33 s predicted. A 1 s SLO cannot be kept."""
    admission, _ = full_engine()
    with pytest.raises(SloUnattainable, match="predicted TTFT 1330 ms"):
        admission.admit("late", 100, SamplingParams(slo_ttft_ms=1000))
    admission.admit("fits", 100, SamplingParams(slo_ttft_ms=1500))
    assert admission.predicted_ttft_s("fits") == pytest.approx(1.33)


def test_a_request_waits_behind_those_already_waiting_for_a_slot() -> None:
    """ "first" takes the slot freed at 1.2 s; the next frees at 2.4 s (80 steps)."""
    admission, _ = full_engine()
    admission.admit("first", 100, SamplingParams(max_tokens=200))
    admission.admit("second", 100, SamplingParams())
    assert admission.predicted_ttft_s("second") == pytest.approx(2.4 + 0.13)


def test_with_a_free_slot_there_is_no_slot_wait() -> None:
    admission, _ = full_engine(capacity=3)
    admission.admit("free", 100, SamplingParams(slo_ttft_ms=1000))
    assert admission.predicted_ttft_s("free") == pytest.approx(0.13)


def test_a_slot_wait_is_not_scaled_by_the_prefills_ratios() -> None:
    """Prefills ran at four times their 130 ms prediction; the slot wait's own ratios
    (none yet) leave the 1.33 s wait unscaled: a 1.5 s SLO still fits."""
    admission, clock = full_engine()
    admission.settings = AdmissionSettings(mode="on", min_samples=1, margin=0.0)
    admission._ttft_ratios.extend([(clock.now, 4.0)] * 4)
    admission.admit("fits", 100, SamplingParams(slo_ttft_ms=1500))
    assert admission.snapshot().decisions[REFUSED_TTFT] == 0


def test_a_slot_wait_does_not_feed_the_prefill_line() -> None:
    admission, clock = full_engine()
    admission.admit("late", 100, SamplingParams())
    line = (admission.predictor.prefill_fixed_s, admission.predictor.prefill_s_per_token)
    clock.now += 1.3
    admission.saw_tokens("late", 1)
    assert (admission.predictor.prefill_fixed_s, admission.predictor.prefill_s_per_token) == line


def test_quantile_zero_compares_the_prediction_itself() -> None:
    admission = running_late(quantile=0.0)
    admission.admit("tight", 100, SamplingParams(slo_ttft_ms=250))
    assert admission.snapshot().decisions[REFUSED_TTFT] == 0


def test_settings_from_parameters() -> None:
    assert AdmissionSettings.from_parameters({}).mode == "off"
    settings = AdmissionSettings.from_parameters(
        {"admission": "on", "admission_margin": "0.2", "admission_min_samples": "3"}
        | {"admission_quantile": "0.9"}
    )
    assert settings.enabled and settings.margin == 0.2 and settings.min_samples == 3
    assert settings.quantile == 0.9
    assert AdmissionSettings.from_parameters({}).quantile == 0.95


@pytest.mark.parametrize(
    ("parameters", "named"),
    [
        ({"admission": "maybe"}, "parameters.admission:"),
        ({"admission_margin": "1.5"}, "parameters.admission_margin: must be in [0, 1)"),
        ({"admission_min_samples": "x"}, "parameters.admission_min_samples:"),
        ({"admission_quantile": "1"}, "parameters.admission_quantile: must be in [0, 1)"),
    ],
)
def test_bad_settings_name_the_parameter(parameters: dict, named: str) -> None:
    with pytest.raises(ValueError, match=f"^{named}".replace("[", r"\[").replace(")", r"\)")):
        AdmissionSettings.from_parameters(parameters)


def test_model_defaults_are_typed_and_validated() -> None:
    defaults = model_defaults({"default_slo_ttft_ms": "500", "default_priority": "-3"})
    assert defaults == {"slo_ttft_ms": 500.0, "priority": -3}
    with pytest.raises(RequestError, match=r"parameters\.default_slo_tpot_ms: must be a positive"):
        model_defaults({"default_slo_tpot_ms": "0"})
