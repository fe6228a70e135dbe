"""Per-request timings → the numbers a contract is judged by.

Every driver (aiperf against a server, the offline engine loop) reduces its output to
:class:`MeasuredRequest` objects, and only this module turns records into percentiles,
throughput and goodput. One definition for every target is what makes the columns of
the report comparable.

Definitions (all per measured level):
- TTFT: request start to first streamed token.
- TPOT: (e2e - TTFT) / (output tokens - 1): the mean decode step a request saw.
- ITL: every gap between consecutive streamed chunks, pooled over requests.
- output tok/s: output tokens of successful requests / wall time of the level
  (first request start → last request end).
- goodput: successful requests with TTFT ≤ SLO TTFT and TPOT ≤ SLO TPOT, per second;
  ``goodput_share`` is the same count over all requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel

from tritonforge.bench.contract import Slo


@dataclass
class MeasuredRequest:
    """What one benchmark request did, as the driver that sent it measured it.

    Client-side numbers only; the server's own per-request record is
    :class:`tritonforge.runtime.RequestRecord`, a different thing.
    """

    index: int
    start_ns: int
    end_ns: int
    ok: bool
    output_tokens: int = 0
    ttft_ms: float | None = None
    chunk_gaps_ms: list[float] = field(default_factory=list)
    error: str | None = None

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
        ordered = sorted(values)
        return cls(
            mean=sum(ordered) / len(ordered),
            p50=percentile(ordered, 50),
            p95=percentile(ordered, 95),
            p99=percentile(ordered, 99),
        )


class LevelMetrics(BaseModel):
    """One target at one load level."""

    level: float
    requests: int
    errors: int
    error_share: float
    duration_s: float
    ttft_ms: Percentiles
    tpot_ms: Percentiles
    itl_ms: Percentiles
    e2e_ms: Percentiles
    output_tokens: int
    output_tok_s: float
    requests_s: float
    goodput_rps: float
    goodput_share: float
    slo_met: bool
    error_samples: list[str] = []


def percentile(ordered: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile of sorted values (numpy's default method)."""
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


def meets_slo(record: MeasuredRequest, slo: Slo) -> bool:
    """A request counts toward goodput only if it succeeded within both bounds."""
    if not record.ok or record.ttft_ms is None or record.ttft_ms > slo.ttft_p95_ms:
        return False
    tpot = record.tpot_ms
    return tpot is None or tpot <= slo.tpot_p95_ms


def summarize(level: float, records: Sequence[MeasuredRequest], slo: Slo) -> LevelMetrics:
    """Aggregate one level's records; failed requests count in errors, not in latency."""
    if not records:
        raise ValueError(f"no records for level {level:g}")
    ok = [r for r in records if r.ok]
    start = min(r.start_ns for r in records)
    end = max(r.end_ns for r in records)
    duration_s = max((end - start) / 1e9, 1e-9)
    output_tokens = sum(r.output_tokens for r in ok)
    ttft = Percentiles.of([r.ttft_ms for r in ok if r.ttft_ms is not None])
    tpot = Percentiles.of([t for r in ok if (t := r.tpot_ms) is not None])
    good = sum(meets_slo(r, slo) for r in records)
    errors = len(records) - len(ok)
    error_share = errors / len(records)
    slo_met = (
        error_share <= slo.error_budget
        and ttft.p95 is not None
        and ttft.p95 <= slo.ttft_p95_ms
        and (tpot.p95 is None or tpot.p95 <= slo.tpot_p95_ms)
    )
    samples = sorted({r.error for r in records if r.error})[:3]
    return LevelMetrics(
        level=level,
        requests=len(records),
        errors=errors,
        error_share=error_share,
        duration_s=duration_s,
        ttft_ms=ttft,
        tpot_ms=tpot,
        itl_ms=Percentiles.of([g for r in ok for g in r.chunk_gaps_ms]),
        e2e_ms=Percentiles.of([r.e2e_ms for r in ok]),
        output_tokens=output_tokens,
        output_tok_s=output_tokens / duration_s,
        requests_s=len(ok) / duration_s,
        goodput_rps=good / duration_s,
        goodput_share=good / len(records),
        slo_met=slo_met,
        error_samples=samples,
    )
