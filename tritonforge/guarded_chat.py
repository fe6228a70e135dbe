"""The guarded chat pipeline, without Triton types: guard in → LLM stream → guard out.

The Triton model (``ensembles/guarded_chat/1/model.py``) binds this to BLS calls and a
response sender; everything that decides what the client sees lives here so it is
unit-tested with fakes. One :class:`GuardedChat` run serves one client request on its
own thread: it redacts the prompt, streams the inner model's text through a
:class:`~tritonforge.guard.StreamGuard`, relays the released text, and turns an inner
error or a client cancellation into exactly one final response.

The inner stream is always drained to its end, cancelled or not — after the client's
final response has gone out. A BLS response iterator abandoned half-way leaves the
callee's responses queued in the python backend's stub process, and that once made an
unload hang; draining costs at most the callee's reaction time to the cancellation (one
poll interval of its runtime).

Triton 2.51 workarounds W1 and W3, see docs/triton-2.51-workarounds.md.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

from tritonforge.cancellation import CancelBoard
from tritonforge.guard import Finding, StreamGuard, findings_json, redact
from tritonforge.responses import text_tensor
from tritonforge.schema import TRANSPORT_PARAMETERS, GenerateRequest


@dataclass(frozen=True)
class InnerEvent:
    """One response of the inner model: streamed text, or an error and its Triton code."""

    text: str = ""
    error: str | None = None
    code: int | None = None


class InnerError(RuntimeError):
    """The inner model failed; ``code`` is its Triton error code, passed on to the client."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.code = code


class ClientCancelled(RuntimeError):
    """The client cancelled; its request ends with a CANCELLED error response."""


class Outbox(Protocol):
    """Where the client's responses go (Triton's response sender, at the edge)."""

    def send(self, tensors: dict[str, np.ndarray]) -> None:
        """Send one streamed (non-final) response.

        It never carries an error: an error ends the request, so it goes to :meth:`close`.
        """

    def close(self, tensors: dict[str, np.ndarray] | None, error: Exception | None) -> None:
        """Send the final response: the last tensors, or the error that ends the request."""

    def is_cancelled(self) -> bool: ...


InnerCall = Callable[[dict[str, np.ndarray], str], Iterable[InnerEvent]]


@dataclass
class GuardedInputs:
    """The inner model's input tensors with the prompt redacted, and what was found."""

    tensors: dict[str, np.ndarray]
    findings: list[dict[str, Any]] = field(default_factory=list)


def guard_inputs(request: GenerateRequest, parameters: Mapping[str, Any]) -> GuardedInputs:
    """Redact the prompt and build the inner (always streamed) request's tensors.

    Sampling keys given as request parameters are folded into the inner request's
    ``sampling_parameters`` JSON (the tensor wins on a clash, as in the schema), so
    ``/generate`` clients and tensor clients reach the LLM with the same settings.
    """
    tensors: dict[str, np.ndarray] = {}
    findings: list[dict[str, Any]] = []
    if request.messages is not None:
        messages = []
        for index, message in enumerate(request.messages):
            content, found = redact(message["content"])
            findings += [{**asdict(f), "message": index} for f in found]
            messages.append({**message, "content": content})
        tensors["messages"] = text_tensor(json.dumps(messages))
    else:
        assert request.prompt is not None, "guarded_chat serves text_input or messages"
        text, found = redact(request.prompt)
        findings += [asdict(f) for f in found]
        tensors["text_input"] = text_tensor(text)
    tensors["stream"] = np.array([True])
    return GuardedInputs(tensors, findings)


def sampling_json(parameters: Mapping[str, Any], tensor_json: str | None) -> str | None:
    """Request parameters and the ``sampling_parameters`` tensor as one JSON object."""
    merged = {k: v for k, v in parameters.items() if k not in TRANSPORT_PARAMETERS}
    if tensor_json:
        merged.update(json.loads(tensor_json))
    return json.dumps(merged) if merged else None


def _response(text: str, output: list[Finding], inputs: list[dict] | None) -> dict[str, np.ndarray]:
    tensors = {
        "text_output": text_tensor(text),
        "output_findings": text_tensor(findings_json(output)),
    }
    if inputs is not None:
        tensors["input_findings"] = text_tensor(json.dumps(inputs))
    return tensors


class GuardedChat:
    """Serves one client request (call :meth:`run` on a worker thread)."""

    def __init__(
        self,
        request: GenerateRequest,
        inner_inputs: GuardedInputs,
        request_id: str,
        board: CancelBoard,
        inner_name: str = "vllm_model",
        cancellation_poll_s: float = 0.1,
    ) -> None:
        self.inner_name = inner_name
        self.request = request
        self.inputs = inner_inputs
        self.request_id = request_id
        self.board = board
        self.cancellation_poll_s = cancellation_poll_s

    def run(self, inner: InnerCall, outbox: Outbox) -> str:
        """Relay the inner stream, guarded; returns the outcome for logs and metrics.

        The client's FINAL response goes out as soon as the outcome is known; only then
        is the rest of the inner stream drained (on this worker thread), so a slow or
        cancelled callee never delays the client's end of the request.
        """
        events: Iterator[InnerEvent] = iter(())
        try:
            events = iter(inner(self.inputs.tensors, self.request_id))
            return self._relay(events, outbox)
        except Exception as exc:  # the BLS call itself failed (callee not loaded, …)
            outbox.close(None, InnerError(f"{self.inner_name}: {exc or type(exc).__name__}", None))
            return "failed"
        finally:
            # Triton 2.51 workaround W3, see docs/triton-2.51-workarounds.md
            with contextlib.suppress(Exception):
                for _ in events:
                    pass
            self.board.clear(self.request_id)

    def _relay(self, events: Iterator[InnerEvent], outbox: Outbox) -> str:
        """Guard and relay until the inner stream ends, fails or the client cancels."""
        guard = StreamGuard()
        pending_input_findings: list[dict] | None = self.inputs.findings
        whole: list[str] = []
        found: list[Finding] = []
        last_poll = time.monotonic()
        for event in events:
            now = time.monotonic()
            if now - last_poll >= self.cancellation_poll_s:
                last_poll = now
                if outbox.is_cancelled():
                    # Triton 2.51 workaround W1, see docs/triton-2.51-workarounds.md
                    self.board.cancel(self.request_id)
                    outbox.close(None, ClientCancelled("request cancelled by the client"))
                    return "cancelled"
            if event.error is not None:
                outbox.close(None, InnerError(f"{self.inner_name}: {event.error}", event.code))
                return "failed"
            released, findings = guard.feed(event.text)
            if not self.request.stream:
                whole.append(released)
                found += findings
            elif released or findings:
                outbox.send(_response(released, findings, pending_input_findings))
                pending_input_findings = None
        if outbox.is_cancelled():
            outbox.close(None, ClientCancelled("request cancelled by the client"))
            return "cancelled"
        rest, findings = guard.finish()
        if self.request.stream:
            outbox.close(_response(rest, findings, pending_input_findings), None)
        else:
            outbox.close(
                _response("".join(whole) + rest, found + findings, self.inputs.findings), None
            )
        return "finished"
