"""Per-request timings → the numbers a contract is judged by.

Every driver (aiperf against a server, the offline engine loop) reduces its output to
:class:`MeasuredRequest` objects, and only this module turns records into percentiles,
throughput and goodput. One definition for every target is what makes the columns of
the report comparable.

Definitions (all per measured level):
- TTFT: request start to first streamed token.
- TPOT: (e2e - TTFT) / (output tokens - 1): the mean decode step a request saw.
- ITL: every gap between consecutive streamed chunks, pooled over requests.
- output tokens: the tokens that *arrived*, as the server counted them (usage,
  ``num_output_tokens``) or a tokenizer over the received text — never the
  ``max_tokens`` asked for. Every arrived token counts, also those of a request that
  later failed or stopped short.
- output tok/s: output tokens / wall time of the level (first request start → last
  request end).
- end state of a request: *finished* (it delivered what it was asked), *short* (it
  ended without error but delivered fewer tokens than the contract forces with
  ``ignore_eos``, or none at all), *error* (transport or server error, cancelled).
- goodput: finished requests with TTFT ≤ SLO TTFT and TPOT ≤ SLO TPOT, per second;
  ``goodput_share`` is the same count over all requests. Short and failed requests
  never count toward it, and both count against the error budget.
- offered req/s (open loop): arrivals per second as sent, (sent - 1) / (last start -
  first start) — the Poisson draw's own rate, not the contract's nominal one.
- achieved req/s (open loop): completions over the level's wall time, finished / (first
  request start → last completion). Requests that finish together read as what they
  are — so many answers in so long — never as a burst rate.
- kept-up req/s (open loop): what achieved would read had no request waited in a queue:
  finished / (first start → the last end with every finished request's time to first token
  as short as the level's shortest). A server keeping up ends the level at about that
  time — its last arrivals' own service time after the last arrival — so achieved ≈
  kept-up however short the level; a saturated one queues, its requests wait longer for
  their first token, and achieved falls below kept-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import BaseModel

from tritonforge.bench.contract import Slo
from tritonforge.bench.noise import NoiseSample

EndState = Literal["finished", "short", "error"]


@dataclass
class MeasuredRequest:
    """What one benchmark request did, as the driver that sent it measured it.

    Client-side numbers only; the server's own per-request record is
    :class:`tritonforge.serving.runtime.RequestRecord`, a different thing.
    """

    index: int
    start_ns: int
    end_ns: int
    ok: bool
    output_tokens: int = 0
    ttft_ms: float | None = None
    chunk_gaps_ms: list[float] = field(default_factory=list)
    error: str | None = None
    expected_tokens: int | None = None  # what the request forced (ignore_eos), else None
    finish_reason: str | None = None  # as the server said it, where the tool records it
    sent: bool = True  # False: the tool has no record of sending it (start_ns is not real)

    @property
    def state(self) -> EndState:
        """How the request ended, judged from what arrived (see the module docstring)."""
        if not self.ok:
            return "error"
        if self.output_tokens == 0:
            return "short"
        if self.expected_tokens is not None and self.output_tokens < self.expected_tokens:
            return "short"
        return "finished"

    @property
    def e2e_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    @property
    def tpot_ms(self) -> float | None:
        if self.ttft_ms is None or self.output_tokens < 2:
            return None
        return (self.e2e_ms - self.ttft_ms) / (self.output_tokens - 1)


class Percentiles(BaseModel):
    mean: float | None = None
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles:
        if not values:
            return cls()
        return cls(
            mean=sum(values) / len(values),
            p50=percentile(values, 50),
            p95=percentile(values, 95),
            p99=percentile(values, 99),
        )


class LevelMetrics(BaseModel):
    """One target at one load level."""

    level: float
    round: int = 0  # which interleaved round (0-based) these numbers come from
    requests: int
    errors: int
    short: int = 0  # ended without error but delivered fewer tokens than forced
    error_share: float  # (errors + short) / requests: what the error budget is judged on
    duration_s: float
    ttft_ms: Percentiles
    tpot_ms: Percentiles
    itl_ms: Percentiles
    e2e_ms: Percentiles
    output_tokens: int  # tokens that arrived, over every request
    expected_tokens: int | None = None  # tokens the requests forced, when all did
    output_tok_s: float
    requests_s: float
    goodput_rps: float
    goodput_share: float
    slo_met: bool
    offered_rps: float | None = None  # arrivals/s between the first and last request sent
    achieved_rps: float | None = None  # finished / (first start → last completion)
    kept_up_rps: float | None = None  # the achieved rate had no request queued
    error_samples: list[str] = []
    noise: NoiseSample | None = None  # the machine around this round (runner fills it)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values``, linearly interpolated; None when empty.

    The one percentile of the benchmark tool and perf/: every report, the serving ceiling
    and the reliability verdicts read their tails the same way (numpy's default method).
    """
    if not values:
        return None
    return float(np.percentile(values, q))


def meets_slo(record: MeasuredRequest, slo: Slo) -> bool:
    """A request counts toward goodput only if it finished within both bounds."""
    if record.state != "finished" or record.ttft_ms is None or record.ttft_ms > slo.ttft_p95_ms:
        return False
    tpot = record.tpot_ms
    return tpot is None or tpot <= slo.tpot_p95_ms


def describe_end(record: MeasuredRequest) -> str | None:
    """Why a request did not finish, for the report's samples; None if it finished."""
    if record.state == "error":
        return record.error or "error"
    if record.state == "short":
        asked = f" of {record.expected_tokens}" if record.expected_tokens is not None else ""
        return f"short: {record.output_tokens}{asked} tokens arrived"
    return None


def rate_between(stamps_ns: Sequence[int]) -> float | None:
    """Events per second between the first and the last: (n - 1) / span; None below two.

    Zero span (two events in the same nanosecond) is no measurable rate either.
    """
    if len(stamps_ns) < 2:
        return None
    span_s = (max(stamps_ns) - min(stamps_ns)) / 1e9
    return (len(stamps_ns) - 1) / span_s if span_s > 0 else None


def _per_second(count: int, start_ns: int, end_ns: int) -> float | None:
    span_s = (end_ns - start_ns) / 1e9
    return count / span_s if span_s > 0 else None


def achieved_rate(records: Sequence[MeasuredRequest]) -> float | None:
    """Finished requests over the level's wall time (first start → last completion).

    None when the tool sent nothing; 0 when something was sent and nothing finished.
    """
    starts = [r.start_ns for r in records if r.sent]
    finished = [r for r in records if r.state == "finished"]
    if not starts:
        return None
    if not finished:
        return 0.0
    return _per_second(len(finished), min(starts), max(r.end_ns for r in finished))


def kept_up_rate(records: Sequence[MeasuredRequest]) -> float | None:
    """Finished requests over the wall time the level would have had with no queue.

    Each finished request's end is moved earlier by the time it waited for its first
    token beyond the level's shortest wait; its own decoding stays as it was. The same
    count as :func:`achieved_rate`, so their ratio is about time alone (errors and short
    answers count against goodput). None without a finished request.
    """
    starts = [r.start_ns for r in records if r.sent]
    finished = [r for r in records if r.state == "finished"]
    if not starts or not finished:
        return None
    quickest_ms = min((r.ttft_ms for r in finished if r.ttft_ms is not None), default=0.0)

    def unqueued_end(r: MeasuredRequest) -> int:
        extra_wait_ms = 0.0 if r.ttft_ms is None else r.ttft_ms - quickest_ms
        return r.end_ns - int(extra_wait_ms * 1e6)

    return _per_second(len(finished), min(starts), max(unqueued_end(r) for r in finished))


def summarize(level: float, records: Sequence[MeasuredRequest], slo: Slo) -> LevelMetrics:
    """Aggregate one level's records.

    Throughput counts every token that arrived; latency percentiles come from the
    requests that ended without error; goodput and requests/s only from finished ones.
    """
    if not records:
        raise ValueError(f"no records for level {level:g}")
    ok = [r for r in records if r.ok]
    finished = [r for r in records if r.state == "finished"]
    start = min(r.start_ns for r in records)
    end = max(r.end_ns for r in records)
    duration_s = max((end - start) / 1e9, 1e-9)
    output_tokens = sum(r.output_tokens for r in records)
    expected = [r.expected_tokens for r in records]
    ttft = Percentiles.of([r.ttft_ms for r in ok if r.ttft_ms is not None])
    tpot = Percentiles.of([t for r in ok if (t := r.tpot_ms) is not None])
    good = sum(meets_slo(r, slo) for r in records)
    errors = len(records) - len(ok)
    short = len(ok) - len(finished)
    error_share = (errors + short) / len(records)
    slo_met = (
        error_share <= slo.error_budget
        and ttft.p95 is not None
        and ttft.p95 <= slo.ttft_p95_ms
        and (tpot.p95 is None or tpot.p95 <= slo.tpot_p95_ms)
    )
    samples = sorted({why for r in records if (why := describe_end(r))})[:3]
    return LevelMetrics(
        level=level,
        requests=len(records),
        errors=errors,
        short=short,
        error_share=error_share,
        duration_s=duration_s,
        ttft_ms=ttft,
        tpot_ms=tpot,
        itl_ms=Percentiles.of([g for r in ok for g in r.chunk_gaps_ms]),
        e2e_ms=Percentiles.of([r.e2e_ms for r in ok]),
        output_tokens=output_tokens,
        expected_tokens=None if None in expected else sum(e or 0 for e in expected),
        output_tok_s=output_tokens / duration_s,
        requests_s=len(finished) / duration_s,
        goodput_rps=good / duration_s,
        goodput_share=good / len(records),
        slo_met=slo_met,
        offered_rps=rate_between([r.start_ns for r in records if r.sent]),
        achieved_rps=achieved_rate(records),
        kept_up_rps=kept_up_rate(records),
        error_samples=samples,
    )
