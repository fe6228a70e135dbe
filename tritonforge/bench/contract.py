"""The evaluation contract: what a benchmark run promises to measure, fixed before it runs.

A contract is a YAML file under ``perf/contracts/``. It pins the SLO, the traffic mix
(length *distributions* per request class, the share reusing a common prefix), the load
levels, the request counts and warm-up, the sampling parameters and the targets to
compare. Writing these down first is what makes two runs (or two engines) comparable:
nothing about the load is chosen after seeing the numbers.

Validation is pydantic's: an invalid contract raises :class:`ContractError` whose
message names each offending field by its dotted path (``traffic.classes.1.share``).
"""

from __future__ import annotations

import hashlib
import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tritonforge.bench.noise import MAX_FOREIGN_CPU_SHARE

SHARE_TOLERANCE = 1e-6
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class ContractError(ValueError):
    """A contract that cannot be run; the message names the field(s) at fault."""


class Strict(BaseModel):
    """Unknown keys are errors: a typo in a contract must not silently change the load."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# --- length distributions -------------------------------------------------------------


class Fixed(Strict):
    dist: Literal["fixed"]
    value: int = Field(ge=1)

    def bounds(self) -> tuple[int, int]:
        return self.value, self.value

    def mean(self) -> float:
        return float(self.value)


class Bounded(Strict):
    """A distribution drawn within ``[min, max]``."""

    min: int = Field(default=1, ge=1)
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.max < self.min:
            raise ValueError("max must be >= min")
        return self

    def bounds(self) -> tuple[int, int]:
        return self.min, self.max


class Uniform(Bounded):
    dist: Literal["uniform"]
    min: int = Field(ge=1)

    def mean(self) -> float:
        return (self.min + self.max) / 2


class Normal(Bounded):
    """A normal distribution clipped to ``[min, max]`` (lengths are never negative)."""

    dist: Literal["normal"]
    mean_: float = Field(alias="mean", gt=0)
    stddev: float = Field(ge=0)

    def mean(self) -> float:
        return min(max(self.mean_, self.min), self.max)


class LogNormal(Bounded):
    """Long-tailed lengths (documents, chat transcripts); ``median`` and log-space ``sigma``."""

    dist: Literal["lognormal"]
    median: float = Field(gt=0)
    sigma: float = Field(ge=0)

    def mean(self) -> float:
        import math

        return min(max(self.median * math.exp(self.sigma**2 / 2), self.min), self.max)


LengthDistribution = Annotated[Fixed | Uniform | Normal | LogNormal, Field(discriminator="dist")]


# --- the contract's sections --------------------------------------------------------------


class Slo(Strict):
    """Per-request objectives; goodput counts the requests that meet both."""

    ttft_p95_ms: float = Field(gt=0, description="time to first token, p95 bound")
    tpot_p95_ms: float = Field(gt=0, description="time per output token after the first, p95 bound")
    error_budget: float = Field(
        ge=0, le=1, description="largest acceptable share of failed requests"
    )


class RequestClass(Strict):
    """One kind of request in the mix (short chat, long document, structured output…)."""

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    share: float = Field(gt=0, le=1)
    input_tokens: LengthDistribution
    output_tokens: LengthDistribution
    instruction: str = Field(
        default="",
        description="text placed before the synthetic body (e.g. 'Answer in JSON:'); "
        "counted in input_tokens",
    )


class SharedPrefix(Strict):
    """A common prefix (system prompt, few-shot block) that some requests start with."""

    share: float = Field(ge=0, le=1, description="share of requests that begin with the prefix")
    tokens: int = Field(ge=0, description="prefix length in tokens")


class Traffic(Strict):
    classes: list[RequestClass] = Field(min_length=1)
    shared_prefix: SharedPrefix = SharedPrefix(share=0, tokens=0)

    @model_validator(mode="after")
    def _consistent(self) -> Traffic:
        total = sum(c.share for c in self.classes)
        if abs(total - 1.0) > SHARE_TOLERANCE:
            raise ValueError(f"class shares must add up to 1.0, got {total:g}")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError(f"class names must be unique, got {names}")
        if self.shared_prefix.share > 0:
            shortest = min(c.input_tokens.bounds()[0] for c in self.classes)
            if self.shared_prefix.tokens >= shortest:
                raise ValueError(
                    f"shared_prefix.tokens ({self.shared_prefix.tokens}) must be shorter than "
                    f"the shortest possible input ({shortest})"
                )
        return self


MAX_SWEEP_RATES = 12  # a sweep longer than this is a typo in step or factor, not a plan


class RateSweep(Strict):
    """Request rates from ``start`` up to ``max``: times ``factor`` or plus ``step`` each level."""

    start: float = Field(gt=0, description="the first rate (requests/s)")
    max: float = Field(gt=0, description="the last rate is the largest one not above this")
    factor: float | None = Field(default=None, gt=1, description="each rate = previous x factor")
    step: float | None = Field(default=None, gt=0, description="each rate = previous + step")

    @model_validator(mode="after")
    def _well_formed(self) -> RateSweep:
        if (self.factor is None) == (self.step is None):
            raise ValueError("give exactly one of factor or step")
        if self.max < self.start:
            raise ValueError("max must be >= start")
        if len(self.rates()) > MAX_SWEEP_RATES:
            raise ValueError(
                f"{len(self.rates())} rates from {self.start:g} to {self.max:g}: "
                f"at most {MAX_SWEEP_RATES} (raise factor or step)"
            )
        return self

    def rates(self) -> list[float]:
        """The swept rates, ascending; computed by index so steps never drift."""
        rates: list[float] = []
        i = 0
        while len(rates) <= MAX_SWEEP_RATES:
            rate = self.start * self.factor**i if self.factor else self.start + i * (self.step or 0)
            if rate > self.max * (1 + 1e-9):
                break
            rates.append(round(rate, 3))
            i += 1
        return rates


class SweepSpec(Strict):
    """``request_rates: {sweep: {start, factor | step, max}}``."""

    sweep: RateSweep


class Saturation(Strict):
    """When a round at a request rate counts as keeping up (see saturation.py for the rule)."""

    min_goodput_share: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="a round holds only if at least this share of its requests finished "
        "within both SLO bounds",
    )
    min_achieved_ratio: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="a round holds only if its completions over its wall time reached at "
        "least this ratio of the rate it would have shown with no request queued",
    )


class RoundsLoad(Strict):
    """What every contract's ``load`` says the same way, whichever runner reads it: how
    many requests a level measures, how long it may take, how many interleaved rounds,
    and how quiet the machine must be for a verdict."""

    requests_per_level: int = Field(ge=1, description="measured requests at each level")
    requests_per_concurrency: int = Field(
        default=0,
        ge=0,
        description="at least this many requests per unit of concurrency (2 → 64 at 32), "
        "so high levels run past their first wave",
    )
    warmup_requests: int = Field(default=0, ge=0, description="sent before measuring, not counted")
    max_duration_s: float = Field(
        gt=0, description="upper bound on one level's run; the tool is stopped past it"
    )
    rounds: int = Field(
        default=3,
        ge=1,
        description="each level of each target runs this many times, the targets' order "
        "rotated per round; comparisons are judged on the rounds' spread (3 or more)",
    )
    max_foreign_cpu_share: float = Field(
        default=MAX_FOREIGN_CPU_SHARE,
        gt=0,
        le=1,
        description="above this share of the machine used by other processes during any "
        "round the run is noisy and gets no verdict",
    )

    def count_for(self, concurrency: float) -> int:
        """Measured requests at one concurrency level."""
        return max(self.requests_per_level, int(self.requests_per_concurrency * concurrency))


class Load(RoundsLoad):
    """Closed-loop concurrency levels or open-loop request rates (exactly one).

    ``request_rates`` is a list of rates or ``{sweep: {start, factor | step, max}}``. A
    sweep stops raising the rate for a target once a rate *broke* in every round (the
    target is saturated; see :mod:`tritonforge.bench.saturation`), and ends when every
    target has stopped. ``saturation`` sets the rule; it applies to request rates only.
    """

    concurrency: list[Annotated[int, Field(ge=1)]] | None = None
    request_rates: list[Annotated[float, Field(gt=0)]] | SweepSpec | None = None
    saturation: Saturation | None = Field(
        default=None, description="the saturation rule (request rates only; defaults apply)"
    )
    noisy_round_retries: int = Field(
        default=1,
        ge=0,
        le=3,
        description="a round during which other processes took more than "
        "max_foreign_cpu_share, or whose load tool failed, is measured again this many "
        "times at most (the noisy measurement is kept in the results as discarded, the "
        "failure as a note); still noisy → the run is noisy",
    )

    @model_validator(mode="after")
    def _one_mode(self) -> Load:
        if (self.concurrency is None) == (self.request_rates is None):
            raise ValueError("give exactly one of concurrency or request_rates")
        levels = self.levels
        if self.concurrency is not None and self.saturation is not None:
            raise ValueError("saturation applies to request_rates, not concurrency levels")
        if self.request_rates is not None and self.requests_per_level < 2:
            raise ValueError(
                "a request rate needs requests_per_level >= 2 (arrival and completion rates "
                "are measured between requests)"
            )
        if not levels:
            raise ValueError("the load needs at least one level")
        if len(set(levels)) != len(levels):
            raise ValueError(f"levels must be distinct, got {levels}")
        for level in self.concurrency or []:
            if self.count_for(level) < level:
                raise ValueError(
                    f"concurrency {level} never fills with {self.count_for(level)} requests: "
                    "raise requests_per_level or set requests_per_concurrency"
                )
        return self

    def count_for(self, level: float) -> int:
        """Measured requests at one level (a request rate: ``requests_per_level``)."""
        if self.concurrency is None:
            return self.requests_per_level
        return super().count_for(level)

    @property
    def mode(self) -> Literal["concurrency", "request_rate"]:
        return "concurrency" if self.concurrency is not None else "request_rate"

    @property
    def levels(self) -> list[float]:
        """Every level the contract may run, ascending for a sweep."""
        if isinstance(self.request_rates, SweepSpec):
            return self.request_rates.sweep.rates()
        return [float(x) for x in (self.concurrency or self.request_rates or [])]

    @property
    def sweep(self) -> bool:
        """True when the rates are a sweep: a saturated target stops being raised."""
        return isinstance(self.request_rates, SweepSpec)

    @property
    def saturation_rule(self) -> Saturation | None:
        """The saturation rule of a request-rate load (defaults if unset); None for concurrency."""
        if self.mode != "request_rate":
            return None
        return self.saturation or Saturation()


class Sampling(Strict):
    """Sampling parameters sent with every request, mapped per target by its driver."""

    temperature: float = Field(default=0.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    ignore_eos: bool = Field(
        default=True,
        description="generate exactly the drawn output length, so every target does equal work",
    )


class TargetKind(StrEnum):
    TRITON = "triton"  # a model served by tritonserver from model_repository/
    VLLM_OPENAI = "vllm_openai"  # vLLM's own OpenAI-compatible server, the reference
    VLLM_OFFLINE = "vllm_offline"  # vLLM's LLMEngine in-process: the engine's ceiling
    OPENAI = "openai"  # tritonforge.openai in front of tritonserver serving ``model``
    LLAMACPP_SERVER = "llamacpp_server"  # llama-cpp-python's own OpenAI-compatible server


class Target(Strict):
    """Something to measure. Adding a model to compare is a new entry here, not new code."""

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    kind: TargetKind
    model: str | None = Field(
        default=None, description="Triton model name (kind triton): vllm_model, ensemble_vllm…"
    )
    engine_config: str | None = Field(
        default=None,
        description="engine settings (model.json) for vllm_openai / vllm_offline / "
        "llamacpp_server, relative to the repository root: the same file the Triton model "
        "reads",
    )
    tool: Literal["aiperf", "perf_analyzer"] = Field(
        default="aiperf",
        description="aiperf (HTTP, every served kind) or perf_analyzer (triton: the gRPC "
        "stream; openai / vllm_openai with chat: streamed chat completions), so one client "
        "can drive every side of a protocol comparison",
    )
    chat: bool = Field(
        default=False,
        description="send each prompt as one user message through the model's chat template "
        "(OpenAI chat endpoint, Triton's messages input) instead of as raw text; targets "
        "compared with each other should agree, or one side prefills more tokens",
    )

    @model_validator(mode="after")
    def _fields_for_kind(self) -> Target:
        if self.kind in (TargetKind.TRITON, TargetKind.OPENAI) and not self.model:
            raise ValueError(f"the {self.kind.value} target needs model (the Triton model name)")
        if self.tool == "perf_analyzer" and self.kind is TargetKind.VLLM_OFFLINE:
            raise ValueError("perf_analyzer drives a server: the offline engine has none")
        if self.tool == "perf_analyzer" and self.kind is not TargetKind.TRITON and not self.chat:
            raise ValueError(
                f"perf_analyzer on a {self.kind.value} target needs chat: true "
                "(its OpenAI client speaks only /v1/chat/completions)"
            )
        if self.chat and self.kind is TargetKind.VLLM_OFFLINE:
            raise ValueError("the offline engine takes raw prompts: chat is for served targets")
        if self.chat and self.kind is TargetKind.TRITON and self.tool == "aiperf":
            raise ValueError(
                "chat on a triton target needs perf_analyzer (the aiperf template sends text)"
            )
        served_by_triton = (TargetKind.TRITON, TargetKind.OPENAI)
        if self.kind not in served_by_triton and not self.engine_config:
            raise ValueError(f"a {self.kind.value} target needs engine_config (a model.json path)")
        if self.kind is TargetKind.LLAMACPP_SERVER and self.tool == "perf_analyzer":
            raise ValueError("llamacpp_server targets are driven by aiperf (completions)")
        return self


class Comparison(Strict):
    """A target checked against a baseline; recorded in the report, never asserted in tests."""

    target: str
    baseline: str
    min_throughput_ratio: float | None = Field(default=None, gt=0)
    max_ttft_p50_delta_ms: float | None = None
    max_ttft_p50_ratio: float | None = Field(
        default=None,
        gt=0,
        description="target's TTFT p50 / the baseline's, per round (1.05: at most 5 % more); "
        "for a cost that scales with the TTFT itself, such as an ensemble's extra steps",
    )
    levels: list[float] | None = Field(default=None, description="levels to compare (default all)")


class OverloadTargets(Strict):
    """What an overload run must show (perf/contracts/overload.yaml says why each)."""

    at_multiple: float = Field(default=2.0, gt=1, description="the overloaded rate judged")
    min_goodput_share_of_peak: float = Field(
        default=0.8, gt=0, le=1, description="goodput with admission / the sweep's peak"
    )
    min_goodput_gain: float = Field(
        default=3.0, gt=0, description="goodput with admission / goodput without"
    )
    min_admitted_slo_share: float = Field(
        default=0.95, gt=0, le=1, description="admitted requests that meet their SLO"
    )
    max_refusal_p99_ms: float = Field(default=50, gt=0, description="time to answer a refusal")
    max_ttft_error_p50: float = Field(
        default=0.2,
        gt=0,
        description="|predicted - actual| / actual TTFT over a cell's admitted requests, its "
        "warm-up included (the median's histogram bucket)",
    )


class Overload(Strict):
    """Runs past saturation: each multiple of the swept saturation rate, admission on and
    off interleaved per round, every request carrying the contract's SLO as its own."""

    saturation_multiples: list[Annotated[float, Field(gt=0)]] = Field(min_length=2)
    warmup_s: float = Field(ge=0, description="sent before measuring at each rate, not counted")
    duration_s: float = Field(gt=0, description="measured seconds at each rate and mode, a round")
    rounds: int = Field(default=3, ge=1, description="interleaved rounds, order rotated in each")
    slo_check_multiple: float = Field(
        default=0.5,
        gt=0,
        description="below saturation: admission must refuse nothing here and leave goodput "
        "as it is without (judged by the overload report)",
    )
    targets: OverloadTargets = OverloadTargets()

    @model_validator(mode="after")
    def _judgeable(self) -> Overload:
        for needed in (self.targets.at_multiple, self.slo_check_multiple, 1.0):
            if needed not in self.saturation_multiples:
                raise ValueError(
                    f"saturation_multiples must include {needed:g} (judged or checked there)"
                )
        return self


class ContractHead(Strict):
    """What every contract starts with, whichever runner reads it."""

    name: Annotated[str, Field(pattern=NAME_PATTERN)] = Field(
        description="results go to perf/results/<name>/"
    )
    description: str = ""
    model: str = Field(description="model directory name under $TRITONFORGE_MODELS (tokenizer)")


class Contract(ContractHead):
    """A whole evaluation contract: each field's meaning is its description here; what each
    kind of experiment asks for is in docs/benchmarking.md."""

    seed: int = 0
    slo: Slo
    traffic: Traffic
    load: Load
    sampling: Sampling = Sampling()
    targets: list[Target] = Field(min_length=1)
    comparisons: list[Comparison] = []
    overload: Overload | None = Field(
        default=None, description="runs past a swept saturation rate (SLO admission on/off)"
    )

    @model_validator(mode="after")
    def _overload_needs_a_sweep(self) -> Contract:
        if self.overload is not None and not self.load.sweep:
            raise ValueError(
                "overload: multiples of the saturation rate need load.request_rates to be a "
                "sweep that finds it"
            )
        return self

    @model_validator(mode="after")
    def _references(self) -> Contract:
        names = [t.name for t in self.targets]
        for i, target in enumerate(self.targets):
            if target.tool == "perf_analyzer" and self.load.mode != "concurrency":
                # perf_analyzer 2.51 at a request rate over a decoupled stream falls behind
                # its schedule and its export loses token counts: a figure from that would
                # be the tool's, not Triton's.
                raise ValueError(
                    f"targets.{i}.tool: perf_analyzer ({target.name}) runs concurrency levels "
                    "only: at a request rate over Triton's decoupled gRPC stream it falls "
                    "behind its own schedule and writes an unreadable export; use tool: "
                    "aiperf (generate_stream) for request_rates"
                )
            if target.kind is TargetKind.VLLM_OFFLINE and self.load.mode != "concurrency":
                raise ValueError(
                    f"targets.{i}.kind: the offline engine ({target.name}) runs closed-loop "
                    "concurrency levels only: it has no arrivals to pace, so request_rates "
                    "need a served target (triton, openai, vllm_openai)"
                )
        if len(set(names)) != len(names):
            raise ValueError(f"target names must be unique, got {names}")
        for i, comparison in enumerate(self.comparisons):
            for role in ("target", "baseline"):
                ref = getattr(comparison, role)
                if ref not in names:
                    raise ValueError(
                        f"comparisons.{i}.{role}: unknown target {ref!r} (have {names})"
                    )
            for level in comparison.levels or []:
                if level not in self.load.levels:
                    raise ValueError(
                        f"comparisons.{i}.levels: {level:g} is not a load level {self.load.levels}"
                    )
        return self

    def target(self, name: str) -> Target:
        return next(t for t in self.targets if t.name == name)


# --- loading ----------------------------------------------------------------------------


def _describe(error: ValidationError, source: str) -> str:
    lines = [f"invalid contract {source}:"]
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "(top level)"
        # A discriminated union puts the tag in the path (input_tokens.normal.stddev);
        # drop it so the path reads as the YAML does.
        where = re.sub(r"\.(fixed|uniform|normal|lognormal)(?=\.|$)", "", where)
        message = item["msg"].removeprefix("Value error, ")
        lines.append(f"  {where}: {message}")
    return "\n".join(lines)


def parse_contract(data: Any, source: str = "<data>") -> Contract:
    """Validate already-parsed YAML; raise :class:`ContractError` naming the fields."""
    if not isinstance(data, dict):
        raise ContractError(f"invalid contract {source}: the top level must be a mapping")
    try:
        return Contract.model_validate(data)
    except ValidationError as error:
        raise ContractError(_describe(error, source)) from None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML) before validation.

    CI runs the smoke contract with tiny counts this way, so the contract file stays
    the one source and the override is visible in the recorded results.
    """
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ContractError(f"override {item!r} is not of the form dotted.path=value")
        node: Any = data
        parts = key.split(".")
        for part in parts[:-1]:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        last = parts[-1]
        value = yaml.safe_load(raw)
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return data


def load_contract(path: Path, overrides: list[str] | None = None) -> tuple[Contract, str]:
    """Read, override and validate a contract file; also return the text's sha256."""
    text = path.read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ContractError(f"invalid contract {path}: not YAML ({error})") from None
    if overrides:
        if not isinstance(data, dict):
            raise ContractError(f"invalid contract {path}: the top level must be a mapping")
        data = apply_overrides(data, overrides)
    digest = hashlib.sha256(text.encode()).hexdigest()
    return parse_contract(data, str(path)), digest
