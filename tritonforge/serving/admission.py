"""SLO-aware admission: predict a request's latency from what the engine just did, and
refuse at once the requests whose promises cannot be kept.

Past saturation an engine that admits everything lets its queue grow until every
request misses its time to first token (TTFT) and goodput falls to zero while
throughput looks fine. A request refused in a millisecond can go to another replica;
one admitted into a queue it cannot leave in time is lost for everyone.

:class:`LatencyPredictor` is calibrated online from the runtime's own timings (the
engine's stats add the running batch it reports): prefill time as a line over the
tokens to prefill (a fixed cost and a cost per token, fitted to exponentially weighted
moments, each point weighted by 1 / TTFT² so the fit minimises the relative error the
contract judges), and the decode step time as a line over the running batch size, fitted
to an EWMA of the step at each size seen. For an arriving request with ``prompt``
tokens, ``ahead`` tokens of prefill still queued before it, ``batch`` requests running
and ``elapsed`` seconds since the engine's last step ended:

* predicted TTFT = max(fixed + (ahead + prompt) * per token - elapsed, 0) + step(batch + 1)
* predicted TPOT of everyone once it joins = step(batch + 1)

``elapsed`` is the part of the step in progress that has already run: a request
arriving late in a long step waits that much less for the engine to take it.

An engine that decodes at most ``capacity`` sequences at once (vLLM's ``max_num_seqs``,
llama.cpp's ``n_parallel``) makes a request that finds every slot taken wait for one to
free: that wait is the remaining tokens of the request that ends first, at the full
batch's step, queued behind those already waiting for a slot (each holds its slot for its
``max_tokens``). Such a request's TTFT is then predicted as that wait, its own prefill and
a step; it does not feed the prefill line, whose points must be prefill, and its
actual / predicted ratio is kept apart from the others: a prefill's relative error,
large on a prediction of tens of milliseconds, must not scale a wait of seconds. The line
is fitted on TTFT + elapsed, the time from the step's start, so arrival phase is not
noise in it. Replaying the vLLM timeline recorded at saturation
(tests/unit/serving/data/vllm_timeline_4rps.json) the median error after 100 requests
is 0.125 with both, 0.153 with neither (elapsed alone 0.152, the weights alone 0.176).

:class:`Admission` applies the rule: a request with an SLO is refused when its
predicted TTFT exceeds ``slo_ttft_ms`` less the margin, or when the step after it joins
exceeds (less the margin) its own ``slo_tpot_ms`` or that of any request running. Both
predictions are first scaled by how far recent requests ran over theirs: the
``quantile`` of actual / predicted TTFT, and of a finished request's mean TPOT / the
step predicted at the mean batch it decoded in. The scaling is what keeps a p95
promise: a prediction right on average still leaves half the requests above it. The
TPOT ratio compares like with like on purpose: against the step predicted when the
request joined, a request that joined a batch of one and decoded in a batch of six
counts the batch's growth as error, and the inflated scale refuses everything at low
load; with nothing admitted no request finishes to correct it.
A request without an SLO is never refused here; nothing is refused before the
predictor has seen ``min_samples`` first tokens (it could not say why). The scaling reads
only ratios of the last ``RATIO_MAX_AGE_S``, and a request that finds the engine idle is
judged on its prediction unscaled: the ratios measure how queues ran over the model, an
idle engine has none, and with every request refused no ratio could ever correct a stale
one. The model's
runtime owns one and drops it with the engine, so a restarted engine starts afresh.

Pure: no Triton types, no engine types, thread-safe (``submit`` runs on Triton's thread,
observations on the engine loop); unit-tested against recorded engine timelines.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tritonforge.serving.errors import EngineBusy
from tritonforge.serving.sampling import SamplingParams, parse_sampling_value

#: Sampling keys a model may default in config.pbtxt as ``default_<key>`` parameters.
MODEL_DEFAULT_KEYS = ("slo_ttft_ms", "slo_tpot_ms", "priority")

#: Why a request was admitted or refused: the label of the admission counter.
ADMITTED, NO_SLO, REFUSED_TTFT, REFUSED_TPOT = "admitted", "no_slo", "refused_ttft", "refused_tpot"
DECISIONS = (ADMITTED, NO_SLO, REFUSED_TTFT, REFUSED_TPOT)
MODES = ("off", "observe", "on")
#: TTFT errors kept between two metrics snapshots (older ones are dropped).
MAX_PENDING_ERRORS = 4096
#: Recent actual / predicted ratios (TTFT; mean TPOT over the step) a scaling is read from.
RATIO_WINDOW = 256
#: How many times more slowly the prefill line's moments forget than the step EWMAs.
LINE_SLOWER = 4
#: Seconds an actual / predicted ratio counts towards the scaling: a burst's outliers
#: must not outlive the burst.
RATIO_MAX_AGE_S = 60.0
#: Longest time since the engine's last step counted as that step's elapsed part: past
#: it the engine is stalled or in one long prefill, and how much of it is left is unknown.
MAX_STEP_ELAPSED_S = 1.0


class SloUnattainable(EngineBusy):
    """The request's SLO cannot be met now (UNAVAILABLE; the OpenAI frontend: 429).

    The message names the prediction and the SLO, and says when to retry, so a client or
    a load balancer can go elsewhere at once.
    """

    def __init__(self, what: str, predicted_ms: float, slo_ms: float, retry_after_s: int) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(
            f"SLO admission refused the request: predicted {what} {predicted_ms:.0f} ms "
            f"exceeds slo_{what.lower()}_ms {slo_ms:g} ms; retry after {retry_after_s} s "
            "or on another replica"
        )


def model_defaults(parameters: Mapping[str, str]) -> dict[str, Any]:
    """A model's ``default_<key>`` parameters as typed sampling values (validated at load)."""
    return {
        key: parse_sampling_value(key, parameters[f"default_{key}"], f"parameters.default_{key}")
        for key in MODEL_DEFAULT_KEYS
        if parameters.get(f"default_{key}", "").strip()
    }


@dataclass(frozen=True)
class AdmissionSettings:
    """config.pbtxt parameters ``admission`` and ``admission_*``.

    ``admission`` is ``off`` (the default: no prediction, nothing refused), ``observe``
    (predict and export the metrics, refuse nothing: how to judge a model before turning
    it on) or ``on``.
    """

    mode: str = "off"
    #: Fraction of each SLO kept in reserve: refuse when the prediction exceeds
    #: SLO * (1 - margin). 0.1 absorbs the predictor's usual error.
    margin: float = 0.1
    #: First tokens observed before the predictor may refuse anything.
    min_samples: int = 8
    #: Weight of the newest observation in each EWMA.
    alpha: float = 0.2
    #: Quantile of recent actual / predicted (TTFT, and mean TPOT over the step) that
    #: scales each prediction before it meets the SLO (0: no scaling). SLOs are p95s.
    quantile: float = 0.95
    #: Prompt tokens of "a typical request", for the predicted-TTFT gauge.
    typical_prompt_tokens: int = 256

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str]) -> AdmissionSettings:
        """Read ``admission`` and ``admission_<field>``; errors name the parameter."""
        mode = parameters.get("admission", "off").strip().lower() or "off"
        if mode not in MODES:
            raise ValueError(f"parameters.admission: must be one of {MODES}, got {mode!r}")
        values: dict[str, Any] = {"mode": mode}
        rules: tuple[tuple[str, Callable[[str], float], Callable[[float], bool], str], ...] = (
            ("margin", float, lambda v: 0 <= v < 1, "in [0, 1)"),
            ("min_samples", int, lambda v: v >= 1, ">= 1"),
            ("alpha", float, lambda v: 0 < v <= 1, "in (0, 1]"),
            ("quantile", float, lambda v: 0 <= v < 1, "in [0, 1)"),
            ("typical_prompt_tokens", int, lambda v: v >= 1, ">= 1"),
        )
        for name, kind, ok, rule in rules:
            text = parameters.get(f"admission_{name}", "").strip()
            if not text:
                continue
            try:
                value = kind(text)
            except ValueError:
                value = None
            if value is None or not ok(value):
                raise ValueError(f"parameters.admission_{name}: must be {rule}, got {text!r}")
            values[name] = value
        return cls(**values)

    @property
    def enabled(self) -> bool:
        """Whether requests may be refused (``on``)."""
        return self.mode == "on"


def _ewma(old: float | None, new: float, alpha: float) -> float:
    return new if old is None else old + alpha * (new - old)


@dataclass
class LatencyPredictor:
    """Prefill as a line over the tokens to prefill (a fixed cost and a cost per token),
    and the decode step time as a line over the batch size; all exponentially weighted.

    Why prefill is a line: a request pays some time whatever its prompt (handing it to the engine,
    waiting to be scheduled). A cost per token alone spreads that over the tokens, so
    it is too low for short prompts and too high for long ones.
    """

    alpha: float = 0.2
    prefill_s_per_token: float | None = None
    prefill_fixed_s: float = 0.0
    step_s: dict[int, float] = field(default_factory=dict)
    samples: int = 0
    #: Steps observed at each batch size (weighted as in :meth:`observe_step`).
    _step_weight: dict[int, float] = field(default_factory=dict)
    #: EWMAs of the point weight w and of w times tokens x, prefill seconds y, x * x, x * y.
    _moments: tuple[float, ...] | None = None

    def observe_first_token(
        self, work_tokens: int, ttft_s: float, batch: int, elapsed_s: float = 0.0
    ) -> None:
        """A request's first token came ``ttft_s`` after arrival with ``work_tokens`` of
        prefill (its own and what was queued before it), ``batch`` running beside it, and
        ``elapsed_s`` of the engine's step in progress already run when it arrived."""
        x = float(max(work_tokens, 1))
        y = max(ttft_s + elapsed_s - (self.step(batch) or 0.0), 0.0)
        # relative error is what counts: a 0.1 s TTFT missed by 0.05 s weighs as much
        # as a 1 s one missed by 0.5 s
        w = 1.0 / max(ttft_s, 1e-3) ** 2
        old = self._moments
        if old is None and self.prefill_s_per_token is not None:  # a line given: start on it
            on_line = self.prefill_fixed_s + self.prefill_s_per_token * x
            old = (w, w * x, w * on_line, w * x * x, w * x * on_line)
        point = (w, w * x, w * y, w * x * x, w * x * y)
        # a line needs more points than a mean: its moments forget LINE_SLOWER times slower
        weight = self.alpha / LINE_SLOWER
        self._moments = (
            point
            if old is None
            else tuple(o + weight * (n - o) for o, n in zip(old, point, strict=True))
        )
        total, *sums = self._moments
        mean_x, mean_y, mean_xx, mean_xy = (v / total for v in sums)
        spread = mean_xx - mean_x * mean_x
        slope = (mean_xy - mean_x * mean_y) / spread if spread > 1e-6 * mean_x * mean_x else -1.0
        fixed = mean_y - slope * mean_x
        if slope < 0 or fixed < 0:  # prompts too alike for a line, or one that cannot hold
            slope, fixed = mean_y / mean_x, 0.0
        self.prefill_s_per_token, self.prefill_fixed_s = slope, fixed
        self.samples += 1

    def observe_step(self, batch: int, seconds: float, weight: float = 1.0) -> None:
        """One decode step (the gap between two tokens of a request) at ``batch`` running.

        ``weight`` scales the EWMA's alpha: a step seen by every request it served counts
        ``1 / batch`` per request, so it moves the estimate once, like any other step.
        """
        if batch >= 1 and seconds >= 0:
            self.step_s[batch] = _ewma(self.step_s.get(batch), seconds, self.alpha * weight)
            self._step_weight[batch] = self._step_weight.get(batch, 0.0) + weight

    def step(self, batch: int) -> float | None:
        """Step time at ``batch``: a line fitted over the sizes seen (the one size's time
        while only one has been seen).

        Why a line and not the table itself: a size seen a few times holds a few steps,
        and one of them may have carried a prompt's prefill. On vLLM timelines recorded
        on a 2-core host the table went 25 ms at batch 3, 97 ms at 6, 41 ms at 8; a
        request judged on its own size's entry was refused at loads where every request
        met its TPOT SLO. A fit over every size averages that noise away, each size
        weighted by how many steps its EWMA holds.
        """
        sizes = self.step_s
        if not sizes:
            return None
        if len(sizes) == 1:  # one size seen: a step costs at least that
            return next(iter(sizes.values()))
        held = 1.0 / self.alpha  # about as many observations as an EWMA remembers
        weights = {b: min(self._step_weight.get(b, held), held) for b in sizes}
        total = sum(weights.values())
        mean_b = sum(w * b for b, w in weights.items()) / total
        mean_s = sum(weights[b] * s for b, s in sizes.items()) / total
        spread = sum(w * (b - mean_b) ** 2 for b, w in weights.items())
        covariance = sum(weights[b] * (b - mean_b) * (s - mean_s) for b, s in sizes.items())
        slope = max(covariance / spread, 0.0)  # a bigger batch never steps faster
        return max(mean_s + slope * (batch - mean_b), 0.0)

    def ttft(self, work_tokens: int, batch: int, elapsed_s: float = 0.0) -> float | None:
        """Predicted TTFT of a request with ``work_tokens`` of prefill to wait for,
        arriving ``elapsed_s`` into the engine's step in progress."""
        if self.prefill_s_per_token is None:
            return None
        prefill = self.prefill_fixed_s + work_tokens * self.prefill_s_per_token
        return max(prefill - elapsed_s, 0.0) + (self.step(batch) or 0.0)


@dataclass
class _Tracked:
    """One admitted request, as admission sees it."""

    prompt_tokens: int
    work_tokens: int  # its prompt and the prefill queued before it at arrival
    arrived: float
    elapsed_s: float  # how long the engine's step in progress had run at arrival
    predicted_ttft_s: float | None
    slo_tpot_s: float | None
    max_tokens: int = 16  # tokens it may hold its slot for
    slots: int = 1  # sequences it decodes (n)
    slot_wait_s: float = 0.0  # predicted wait for a free slot at arrival
    last_token_at: float | None = None
    first_token_at: float | None = None
    tokens_after_first: int = 0
    batch_tokens: int = 0  # sum of the running batch over its tokens after the first


@dataclass
class AdmissionSnapshot:
    """What the metrics export: counters so far, errors since the last snapshot, gauge."""

    decisions: dict[str, int]
    ttft_errors: list[float]
    typical_ttft_s: float | None


class Admission:
    """The admission rule over one engine's requests (one per model instance)."""

    def __init__(
        self,
        settings: AdmissionSettings,
        clock: Callable[[], float] = time.monotonic,
        engine_running: Callable[[], int] = lambda: 0,
        exporter: Callable[[AdmissionSnapshot], None] | None = None,
        capacity: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.settings = settings
        self._exporter = exporter
        self._clock = clock
        self._engine_running = engine_running
        self._capacity = capacity
        self._lock = threading.Lock()
        self._requests: dict[str, _Tracked] = {}
        self._decisions = dict.fromkeys(DECISIONS, 0)
        self._errors: list[float] = []
        # recent (when, actual / predicted TTFT), and (when, mean TPOT / the step predicted)
        self._ttft_ratios: deque[tuple[float, float]] = deque(maxlen=RATIO_WINDOW)
        self._tpot_ratios: deque[tuple[float, float]] = deque(maxlen=RATIO_WINDOW)
        # the same for requests predicted to wait for a slot: their error is the slot
        # wait's, and a prefill's relative error must not scale a wait of seconds
        self._slot_ratios: deque[tuple[float, float]] = deque(maxlen=RATIO_WINDOW)
        self.predictor = LatencyPredictor(settings.alpha)

    def reset(self) -> None:
        """Forget the calibration (the engine restarted: its speed is news again)."""
        with self._lock:
            self.predictor = LatencyPredictor(self.settings.alpha)
            self._requests.clear()
            self._ttft_ratios.clear()
            self._tpot_ratios.clear()
            self._slot_ratios.clear()

    def _queued_and_batch(self) -> tuple[int, int]:
        """Prefill tokens not yet served, and requests the engine is decoding (locked)."""
        queued = sum(r.prompt_tokens for r in self._requests.values() if r.last_token_at is None)
        decoding = sum(1 for r in self._requests.values() if r.last_token_at is not None)
        return queued, max(decoding, self._engine_running())

    def _step_elapsed(self, now: float) -> float:
        """Seconds since the engine's last step ended, while requests decode (locked).

        A step ends when the decoding requests get their tokens; with none decoding the
        engine takes a new request at once, and nothing of a step is under way.
        """
        last = max(
            (r.last_token_at for r in self._requests.values() if r.last_token_at is not None),
            default=None,
        )
        return 0.0 if last is None else min(max(now - last, 0.0), MAX_STEP_ELAPSED_S)

    def _slot_wait(self, slots: int) -> float:
        """Seconds until ``slots`` more sequences find free slots, behind those already
        waiting for one; 0 with room, or without a known capacity or step (locked).

        A running sequence frees its slot after its remaining tokens at the full batch's
        step; one waiting takes the first slot to free and holds it for its prefill and
        ``max_tokens`` steps. Remaining tokens are counted to ``max_tokens``: a sequence
        that stops early frees its slot sooner, and the TTFT ratios scale that back.
        """
        capacity = self._capacity()
        if not capacity:
            return 0.0
        step = self.predictor.step(capacity)
        decoding = [r for r in self._requests.values() if r.last_token_at is not None]
        waiting = [r for r in self._requests.values() if r.last_token_at is None]
        busy = sum(r.slots for r in decoding) + sum(r.slots for r in waiting)
        if step is None or busy + slots <= capacity:
            return 0.0
        free_at = [
            max(r.max_tokens - 1 - r.tokens_after_first, 0) * step
            for r in decoding
            for _ in range(r.slots)
        ]
        free_at += [0.0] * max(capacity - len(free_at), 0)
        heapq.heapify(free_at)
        for r in sorted(waiting, key=lambda r: r.arrived):
            prefill = self.predictor.ttft(r.prompt_tokens, capacity) or step
            starts = [heapq.heappop(free_at) for _ in range(min(r.slots, len(free_at)))]
            begin = max(starts, default=0.0)
            for _ in starts:
                heapq.heappush(free_at, begin + prefill + r.max_tokens * step)
        return max(heapq.nsmallest(min(slots, len(free_at)), free_at), default=0.0)

    def _idle(self) -> bool:
        """Nothing admitted is in flight and the engine runs nothing (locked)."""
        return not self._requests and self._engine_running() == 0

    def admit(self, request_id: str, prompt_tokens: int, sampling: SamplingParams) -> None:
        """Register the request, or raise :class:`SloUnattainable` naming the prediction."""
        ttft_slo = _seconds(sampling.slo_ttft_ms)
        tpot_slo = _seconds(sampling.slo_tpot_ms)
        with self._lock:
            now = self._clock()
            idle = self._idle()
            queued, batch = self._queued_and_batch()
            elapsed = self._step_elapsed(now)
            wait = self._slot_wait(sampling.n)
            if wait > 0:  # every slot taken: its prefill starts when one frees
                capacity = self._capacity() or batch + 1
                own = self.predictor.ttft(prompt_tokens, capacity)
                work, predicted = prompt_tokens, None if own is None else wait + own
            else:
                work = queued + prompt_tokens
                predicted = self.predictor.ttft(work, batch + 1, elapsed)
            refusal = None
            if ttft_slo is None and tpot_slo is None:
                decision = NO_SLO
            else:
                decision, refusal = self._judge(
                    predicted, ttft_slo, tpot_slo, batch + 1, idle, waits=wait > 0
                )
            self._decisions[decision] += 1
            if refusal is None:
                self._requests[request_id] = _Tracked(
                    prompt_tokens,
                    work,
                    now,
                    elapsed,
                    predicted,
                    tpot_slo,
                    max_tokens=sampling.max_tokens,
                    slots=sampling.n,
                    slot_wait_s=wait,
                )
                return
        raise refusal

    def _scale(self, ratios: deque[tuple[float, float]]) -> float:
        """The ``quantile`` of the actual / predicted ``ratios`` of the last
        ``RATIO_MAX_AGE_S``; 1 while fewer than ``min_samples``, or with quantile 0 (locked)."""
        oldest = self._clock() - RATIO_MAX_AGE_S
        while ratios and ratios[0][0] < oldest:
            ratios.popleft()
        q = self.settings.quantile
        if q <= 0 or len(ratios) < self.settings.min_samples:
            return 1.0
        ordered = sorted(ratio for _, ratio in ratios)
        return ordered[min(int(q * len(ordered)), len(ordered) - 1)]

    def screen(self, sampling: SamplingParams) -> None:
        """The TPOT rule alone, before the prompt is prepared: raise
        :class:`SloUnattainable` if it refuses the request now.

        The rule reads the running batch and the SLOs, not the prompt, so a request it
        refuses is answered without being tokenized first; past saturation it makes
        most refusals. :meth:`admit` still applies both rules afterwards.
        """
        if sampling.slo_ttft_ms is None and sampling.slo_tpot_ms is None:
            return
        with self._lock:
            if not self._may_refuse():
                return
            _, batch = self._queued_and_batch()
            refusal = self._tpot_refusal(_seconds(sampling.slo_tpot_ms), batch + 1, self._idle())
            if refusal is None:
                return
            self._decisions[REFUSED_TPOT] += 1
        raise refusal

    def _may_refuse(self) -> bool:
        """Refusing is on and the predictor has seen enough to say why (locked)."""
        return self.settings.enabled and self.predictor.samples >= self.settings.min_samples

    def _judge(
        self,
        predicted: float | None,
        ttft_slo: float | None,
        tpot_slo: float | None,
        batch: int,
        idle: bool,
        waits: bool = False,
    ) -> tuple[str, SloUnattainable | None]:
        """The decision, and the refusal to raise once unlocked (locked).

        Predictions are scaled (:meth:`_scale`) only here, where a refusal is possible:
        a model that observes, or a request without the SLO, pays nothing for it; a
        request to an ``idle`` engine is judged unscaled, one that ``waits`` for a slot
        by the ratios of those that waited.
        """
        if not self._may_refuse():
            return ADMITTED, None
        keep = 1.0 - self.settings.margin
        if ttft_slo is not None and predicted is not None:
            ratios = self._slot_ratios if waits else self._ttft_ratios
            scaled = predicted * (1.0 if idle else self._scale(ratios))
            if scaled > ttft_slo * keep:
                retry = math.ceil(max(scaled - ttft_slo, 1.0))
                return REFUSED_TTFT, SloUnattainable("TTFT", scaled * 1000, ttft_slo * 1000, retry)
        refusal = self._tpot_refusal(tpot_slo, batch, idle)
        return (REFUSED_TPOT, refusal) if refusal is not None else (ADMITTED, None)

    def _tpot_refusal(
        self, tpot_slo: float | None, batch: int, idle: bool = False
    ) -> SloUnattainable | None:
        """The refusal if the step at ``batch`` breaks the tightest TPOT SLO, the request's
        own or a running one's (locked); unscaled on an ``idle`` engine."""
        step = self.predictor.step(batch)
        tightest = min(
            [r.slo_tpot_s for r in self._requests.values() if r.slo_tpot_s is not None]
            + ([tpot_slo] if tpot_slo is not None else []),
            default=None,
        )
        if step is None or tightest is None:
            return None
        # scaled like a TTFT, by how requests' mean TPOT ran over their predicted step
        step *= 1.0 if idle else self._scale(self._tpot_ratios)
        if step > tightest * (1.0 - self.settings.margin):
            return SloUnattainable("TPOT", step * 1000, tightest * 1000, 1)
        return None

    def saw_tokens(self, request_id: str, count: int) -> None:
        """The engine produced ``count`` tokens of the request: calibrate on them."""
        if count <= 0:
            return
        now = self._clock()
        with self._lock:
            tracked = self._requests.get(request_id)
            if tracked is None:
                return
            _, batch = self._queued_and_batch()
            if tracked.last_token_at is None:
                ttft = now - tracked.arrived
                if tracked.slot_wait_s == 0:  # a slot's wait is not prefill
                    self.predictor.observe_first_token(
                        tracked.work_tokens, ttft, max(batch, 1), tracked.elapsed_s
                    )
                else:
                    self.predictor.samples += 1
                if tracked.predicted_ttft_s is not None and ttft > 0:
                    del self._errors[: max(len(self._errors) - MAX_PENDING_ERRORS + 1, 0)]
                    self._errors.append(abs(tracked.predicted_ttft_s - ttft) / ttft)
                    if tracked.predicted_ttft_s > 0:
                        ratios = self._slot_ratios if tracked.slot_wait_s else self._ttft_ratios
                        ratios.append((now, ttft / tracked.predicted_ttft_s))
                tracked.first_token_at = now
            else:
                # every running request sees this step: a slow one (a prompt prefilled
                # beside the decodes) must not weigh ``batch`` times more than the others
                gap = (now - tracked.last_token_at) / count
                self.predictor.observe_step(batch, gap, weight=1 / max(batch, 1))
                tracked.tokens_after_first += count
                tracked.batch_tokens += max(batch, 1) * count
            tracked.last_token_at = now

    def predicted_ttft_s(self, request_id: str) -> float | None:
        """The TTFT predicted when ``request_id`` was admitted (None: no prediction yet,
        or not admitted): what a trace of the request shows beside the decision."""
        with self._lock:
            tracked = self._requests.get(request_id)
            return None if tracked is None else tracked.predicted_ttft_s

    def release(self, request_id: str) -> None:
        """Forget a finished, cancelled or failed request; its mean TPOT over the step
        predicted at the mean batch it decoded in feeds the TPOT rule's scaling."""
        with self._lock:
            tracked = self._requests.pop(request_id, None)
            if tracked is None or not tracked.tokens_after_first:
                return
            assert tracked.first_token_at is not None and tracked.last_token_at is not None
            tokens = tracked.tokens_after_first
            predicted = self.predictor.step(round(tracked.batch_tokens / tokens))
            if predicted:
                tpot = (tracked.last_token_at - tracked.first_token_at) / tokens
                self._tpot_ratios.append((self._clock(), tpot / predicted))

    def export(self) -> None:
        """Hand a snapshot to the exporter (the metrics), if there is one."""
        if self._exporter is not None:
            self._exporter(self.snapshot())

    def snapshot(self) -> AdmissionSnapshot:
        """Counters so far, the TTFT errors since the last call, the typical prediction."""
        with self._lock:
            queued, batch = self._queued_and_batch()
            typical = self.predictor.ttft(
                queued + self.settings.typical_prompt_tokens,
                batch + 1,
                self._step_elapsed(self._clock()),
            )
            errors, self._errors = self._errors, []
            return AdmissionSnapshot(dict(self._decisions), errors, typical)


def _seconds(milliseconds: float | None) -> float | None:
    return None if milliseconds is None else milliseconds / 1000.0
