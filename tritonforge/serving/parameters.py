"""Every ``parameters { key: … }`` entry a model's config.pbtxt may set, in one table.

Each parameter is read where it acts (the runtime, admission, restarts, the C++ tokenizer,
the guarded chat); this table names them all with their default and meaning, and takes the
defaults of the Python readers from the readers' own settings classes, so it cannot quote
another value. ``python -m tritonforge.reference`` writes docs/reference/configuration.md
from it, and tests/unit/test_reference.py fails when a reader asks for a key this table
lacks, or the table names one no reader asks for.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonforge.serving.admission import MODEL_DEFAULT_KEYS, AdmissionSettings
from tritonforge.serving.outbox import StreamPolicy
from tritonforge.serving.restarts import RestartPolicy

#: The models a parameter applies to.
LLM = "LLM models"
TOKENIZER = "tokenizer models (C++ backend `tokenizer`)"
GUARDED_CHAT = "`guarded_chat`"

#: The runtime's bound on requests in flight, when config.pbtxt sets none.
MAX_INFLIGHT_DEFAULT = 256


@dataclass(frozen=True)
class ModelParameter:
    """One config.pbtxt parameter: its key, default (as written in config.pbtxt), meaning."""

    name: str
    default: str
    meaning: str
    applies_to: str = LLM


def _text(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


_ADMISSION = AdmissionSettings()
_STREAM = StreamPolicy()
_RESTART = RestartPolicy()

_DEFAULT_MEANINGS = {
    "slo_ttft_ms": "a request's `slo_ttft_ms` when it sends none (positive milliseconds)",
    "slo_tpot_ms": "a request's `slo_tpot_ms` when it sends none (positive milliseconds)",
    "priority": "a request's `priority` when it sends none (an integer in [-100, 100])",
}

MODEL_PARAMETERS: tuple[ModelParameter, ...] = (
    ModelParameter(
        "max_inflight",
        str(MAX_INFLIGHT_DEFAULT),
        "requests the model accepts at once; one more is answered UNAVAILABLE (busy) at once",
    ),
    ModelParameter(
        "engine_restart_max",
        _text(_RESTART.max_restarts),
        f"engine restarts allowed within {_RESTART.window_s:.0f} s when the engine dies; "
        "0 turns restarts off (the model still unloads)",
    ),
    ModelParameter(
        "engine_restart_backoff_s",
        _text(_RESTART.backoff_s),
        "seconds before the first restart, doubled for each further one "
        f"(at most {_RESTART.max_backoff_s:.0f} s)",
    ),
    ModelParameter(
        "stream_coalescing",
        _text(_STREAM.coalesce),
        "`true`: deltas that arrive while a request's previous response is on its way leave "
        "together as one response; `false`: one response per delta",
    ),
    ModelParameter(
        "stream_interval",
        _text(_STREAM.interval),
        "whole tokens every streamed response carries at least (the last carries what is left)",
    ),
    ModelParameter(
        "response_threads",
        _text(_STREAM.threads),
        "threads of a model instance that send responses",
    ),
    ModelParameter(
        "cancellation_check_period_ms",
        "the engine's (100; TensorRT-LLM: `triton_config` in model.yaml)",
        "how often each request in flight asks Triton whether its client cancelled",
    ),
    ModelParameter(
        "admission",
        _ADMISSION.mode,
        "SLO admission: `off`, `observe` (predict and export, refuse nothing) or `on` "
        "(refuse requests predicted to miss their SLO)",
    ),
    ModelParameter(
        "admission_margin",
        _text(_ADMISSION.margin),
        "fraction of each SLO kept in reserve: refuse above SLO × (1 − margin)",
    ),
    ModelParameter(
        "admission_min_samples",
        _text(_ADMISSION.min_samples),
        "first tokens observed before admission may refuse anything",
    ),
    ModelParameter(
        "admission_alpha",
        _text(_ADMISSION.alpha),
        "weight of the newest observation in the predictor's exponentially weighted averages "
        "(0 < alpha ≤ 1; higher follows changes faster, and noise too)",
    ),
    ModelParameter(
        "admission_quantile",
        _text(_ADMISSION.quantile),
        "quantile of recent actual / predicted latency that scales each prediction (0: no scaling)",
    ),
    ModelParameter(
        "admission_typical_prompt_tokens",
        _text(_ADMISSION.typical_prompt_tokens),
        "prompt tokens of the typical request whose TTFT the predicted-TTFT gauge reports",
    ),
    *(
        ModelParameter(f"default_{key}", "unset", _DEFAULT_MEANINGS[key])
        for key in MODEL_DEFAULT_KEYS
    ),
    ModelParameter(
        "tokenizer_file",
        "required",
        "the `tokenizer.json` to load (`$VAR` expanded; relative to the model's directory)",
        TOKENIZER,
    ),
    ModelParameter(
        "add_special_tokens",
        "true",
        "encode with the tokenizer's special tokens (a request parameter of the same name wins)",
        TOKENIZER,
    ),
    ModelParameter(
        "skip_special_tokens",
        "true",
        "decode without special tokens (a request parameter of the same name wins)",
        TOKENIZER,
    ),
    ModelParameter(
        "pad_id",
        "0",
        "the token id that pads the shorter rows of a batch",
        TOKENIZER,
    ),
    ModelParameter(
        "llm_model",
        "vllm_model",
        "the LLM model the guarded chat streams from",
        GUARDED_CHAT,
    ),
)


def parameter_names() -> frozenset[str]:
    return frozenset(p.name for p in MODEL_PARAMETERS)
