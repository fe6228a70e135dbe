"""Output tensors for one response, built from engine deltas (pure numpy).

Names, dtypes and meanings follow upstream vllm_backend: ``text_output`` always;
``finish_reason``, ``cumulative_logprob``, ``logprobs``, ``num_input_tokens`` and
``num_output_tokens`` when asked for (``cumulative_logprob`` only where the engine
computed one); ``output_ids`` (this project's) for token-level
pipelines. A streamed response carries what the step added; a non-streamed one the
whole generation (with the prompt in front when upstream semantics say so).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from tritonforge.engines.base import EngineOutput, PositionLogprobs
from tritonforge.serving.schema import ReturnFlags


@dataclass
class Generation:
    """Everything generated so far for one request (the non-streamed answer)."""

    text_parts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] = field(default_factory=list)
    cumulative_logprob: float | None = None
    finish_reason: str | None = None

    def add(self, delta: EngineOutput) -> None:
        self.text_parts.append(delta.text)
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs)
        if delta.cumulative_logprob is not None:
            self.cumulative_logprob = delta.cumulative_logprob
        if delta.finished:
            self.finish_reason = delta.finish_reason

    def as_output(self) -> EngineOutput:
        return EngineOutput(
            text="".join(self.text_parts),
            token_ids=self.token_ids,
            logprobs=self.logprobs or None,
            cumulative_logprob=self.cumulative_logprob,
            finished=True,
            finish_reason=self.finish_reason,
        )


def merge_outputs(first: EngineOutput | None, then: EngineOutput) -> EngineOutput:
    """One delta covering ``first`` followed by ``then`` (``then`` when nothing is held).

    Responses of an n > 1 request merge choice by choice; a choice keeps the finish
    reason it ended with in ``first`` when ``then`` has nothing more of it.
    """
    if first is None:
        return then
    if first.choices is not None and then.choices is not None:
        choices = [_merge_choice(a, b) for a, b in zip(first.choices, then.choices, strict=True)]
        return EngineOutput(choices=choices, finished=then.finished)
    logprobs = None
    if first.logprobs is not None or then.logprobs is not None:
        logprobs = (first.logprobs or []) + (then.logprobs or [])
    return EngineOutput(
        text=first.text + then.text,
        token_ids=first.token_ids + then.token_ids,
        logprobs=logprobs,
        cumulative_logprob=(
            then.cumulative_logprob
            if then.cumulative_logprob is not None
            else first.cumulative_logprob
        ),
        finished=then.finished,
        finish_reason=then.finish_reason,
    )


def _merge_choice(first: EngineOutput, then: EngineOutput) -> EngineOutput:
    merged = merge_outputs(first, then)
    merged.finished = first.finished or then.finished
    merged.finish_reason = then.finish_reason or first.finish_reason
    return merged


def text_tensor(value: str) -> npt.NDArray[Any]:
    """One UTF-8 string as a 1-element BYTES tensor, the shape of every text output."""
    tensor = np.empty(1, dtype=np.object_)
    tensor[0] = value.encode("utf-8")
    return tensor


def build_outputs(
    output: EngineOutput,
    returns: ReturnFlags,
    num_input_tokens: int,
    prefix: str = "",
) -> dict[str, npt.NDArray[Any]]:
    """Tensors for one response; ``prefix`` is the echoed prompt, if any."""
    if output.choices is not None:
        return _choice_outputs(output.choices, returns, num_input_tokens, prefix)
    tensors = {"text_output": text_tensor(prefix + output.text)}
    if returns.finish_reason:
        tensors["finish_reason"] = text_tensor(str(output.finish_reason))
    if returns.cumulative_logprob and output.cumulative_logprob is not None:
        # Absent, never a made-up 0.0, where the engine computed none (no logprobs asked).
        tensors["cumulative_logprob"] = np.array([output.cumulative_logprob], dtype=np.float32)
    if returns.logprobs:
        # JSON ``null`` where no count was asked for (``logprobs`` unset), as vllm_backend.
        tensors["logprobs"] = text_tensor(json.dumps(output.logprobs))
    if returns.num_input_tokens:
        tensors["num_input_tokens"] = np.array([num_input_tokens], dtype=np.uint32)
    if returns.num_output_tokens:
        tensors["num_output_tokens"] = np.array([len(output.token_ids)], dtype=np.uint32)
    if returns.output_ids:
        tensors["output_ids"] = np.array(output.token_ids, dtype=np.int32)
    return tensors


def _choice_outputs(
    choices: list[EngineOutput], returns: ReturnFlags, num_input_tokens: int, prefix: str
) -> dict[str, npt.NDArray[Any]]:
    """Tensors of an n > 1 response: one element per sequence, in index order, as
    vllm_backend sends them (``cumulative_logprob`` only where every sequence has one)."""

    def texts(values: list[str]) -> npt.NDArray[Any]:
        tensor = np.empty(len(values), dtype=np.object_)
        tensor[:] = [value.encode("utf-8") for value in values]
        return tensor

    tensors = {"text_output": texts([prefix + c.text for c in choices])}
    if returns.finish_reason:
        tensors["finish_reason"] = texts([str(c.finish_reason) for c in choices])
    sums = [c.cumulative_logprob for c in choices]
    if returns.cumulative_logprob and all(v is not None for v in sums):
        tensors["cumulative_logprob"] = np.array(sums, dtype=np.float32)
    if returns.logprobs:
        tensors["logprobs"] = texts([json.dumps(c.logprobs) for c in choices])
    if returns.num_input_tokens:
        tensors["num_input_tokens"] = np.array([num_input_tokens], dtype=np.uint32)
    if returns.num_output_tokens:
        tensors["num_output_tokens"] = np.array(
            [len(c.token_ids) for c in choices], dtype=np.uint32
        )
    return tensors
