"""The guarded chat pipeline, without Triton types: guard in → LLM stream → guard out.

The Triton model (``ensembles/guarded_chat/1/model.py``) binds this to an inner gRPC stream and a
response sender; everything that decides what the client sees lives here so it is
unit-tested with fakes. One :class:`GuardedChat` run serves one client request on its
own thread: it redacts the prompt, streams the inner model's text through a
:class:`~tritonforge.pipelines.guard.StreamGuard`, relays the released text, and turns an inner
error or a client cancellation into exactly one final response.

The inner stream is always drained to its end, cancelled or not — after the client's
final response has gone out, so the inner request has ended before the run does and
nothing of it is left queued (W3); draining costs at most the callee's reaction time to
the cancellation (one poll interval of its runtime). An empty event from
the inner call (nothing arrived yet) is where a run looks at its client meanwhile.

Triton 2.51 workarounds W1 and W3, see docs/triton-2.51-workarounds.md.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from tritonforge.pipelines.guard import Finding, StreamGuard, findings_json, redact
from tritonforge.serving.cancellation import CancelBoard
from tritonforge.serving.errors import RequestError
from tritonforge.serving.request_ids import check_request_id
from tritonforge.serving.responses import text_tensor
from tritonforge.serving.schema import (
    TRANSPORT_PARAMETERS,
    GenerateRequest,
    ReturnFlags,
    parse_request,
)


@dataclass(frozen=True)
class InnerEvent:
    """One response of the inner model: streamed text, or an error and its Triton code.

    The counts and the finish reason are there when the client asked for them (the
    ``return_*`` flags are passed on to the inner model).
    """

    text: str = ""
    error: str | None = None
    code: int | None = None
    finish_reason: str | None = None
    num_input_tokens: int | None = None
    num_output_tokens: int | None = None


#: ``return_*`` outputs relayed from the inner model: they describe the generation, not
#: its text, so redaction leaves them true.
RELAYED_RETURNS = ("finish_reason", "num_input_tokens", "num_output_tokens")
#: Token-level outputs are refused: ids and per-token logprobs would spell out the very
#: text the guard redacts.
TOKEN_RETURNS = ("logprobs", "cumulative_logprob", "output_ids")


class InnerError(RuntimeError):
    """The inner model failed; ``code`` is its Triton error code, passed on to the client."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.code = code


class ClientCancelled(RuntimeError):
    """The client cancelled; its request ends with a CANCELLED error response."""


class Outbox(Protocol):
    """Where the client's responses go (Triton's response sender, at the edge)."""

    def send(self, tensors: dict[str, npt.NDArray[Any]]) -> None:
        """Send one streamed (non-final) response.

        It never carries an error: an error ends the request, so it goes to :meth:`close`.
        """

    def close(self, tensors: dict[str, npt.NDArray[Any]] | None, error: Exception | None) -> None:
        """Send the final response: the last tensors, or the error that ends the request."""

    def is_cancelled(self) -> bool: ...


InnerCall = Callable[[dict[str, npt.NDArray[Any]], str], Iterable[InnerEvent]]


@dataclass
class GuardedInputs:
    """The inner model's input tensors with the prompt redacted, and what was found.

    ``echo`` is the redacted text prompt when the client's request asks for the prompt
    before the answer (a non-streamed ``text_input`` without ``exclude_input_in_output``,
    the schema's rule for every LLM model).
    """

    tensors: dict[str, npt.NDArray[Any]]
    findings: list[dict[str, Any]] = field(default_factory=list)
    echo: str = ""


def _redact_tree(value: Any) -> tuple[Any, list[Finding]]:
    """Every string inside ``value`` (a call's arguments) redacted, the JSON kept valid."""
    if isinstance(value, str):
        return redact(value)
    found: list[Finding] = []
    if isinstance(value, list | dict):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        parts = {key: _redact_tree(item) for key, item in items}
        found = [f for _, more in parts.values() for f in more]
        kept = {key: part for key, (part, _) in parts.items()}
        return (kept if isinstance(value, dict) else list(kept.values())), found
    return value, found


def guard_inputs(request: GenerateRequest, parameters: Mapping[str, Any]) -> GuardedInputs:
    """Redact the prompt and build the inner (always streamed) request's tensors.

    The relayed ``return_*`` flags go to the inner model; token-level ones are refused.
    """
    for name in TOKEN_RETURNS:
        if getattr(request.returns, name):
            raise RequestError(
                f"return_{name}",
                "guarded_chat returns no token-level outputs: they would carry the text "
                "the guard redacts",
            )
    if request.prompt_ids is not None:
        raise RequestError("input_ids", "guarded_chat needs text_input or messages to guard")
    tensors: dict[str, npt.NDArray[Any]] = {}
    findings: list[dict[str, Any]] = []
    echo = ""
    if request.messages is not None:
        messages = []
        for index, message in enumerate(request.messages):
            content, found = redact(message["content"] or "")
            findings += [{**asdict(f), "message": index} for f in found]
            kept = None if message["content"] is None else content  # null beside tool_calls
            calls, found = _redact_tree(message.get("tool_calls"))
            findings += [{**asdict(f), "message": index} for f in found]
            messages.append(
                {**message, "content": kept, **({"tool_calls": calls} if calls else {})}
            )
        chat = {"messages": messages, "tools": list(request.tools)}
        tensors["messages"] = text_tensor(json.dumps(chat if request.tools else messages))
    else:
        assert request.prompt is not None
        text, found = redact(request.prompt)
        findings += [asdict(f) for f in found]
        tensors["text_input"] = text_tensor(text)
        echo = text if request.prepend_input else ""
    tensors["stream"] = np.array([True])
    for name in RELAYED_RETURNS:
        if getattr(request.returns, name):
            tensors[f"return_{name}"] = np.array([True])
    return GuardedInputs(tensors, findings, echo)


def inner_request_id(client_id: str) -> str:
    """The id of the inner model's request for a client request of id ``client_id``.

    Unique, since the cancellation board keys by it and the inner model refuses an id
    already in flight; prefixed with the client's id when it has a usable one, so the
    inner model's errors, log lines and spans name the request the client knows.
    """
    own = f"guarded_chat-{uuid.uuid4().hex}"
    try:
        check_request_id(client_id, "id")
    except RequestError:
        return own
    return f"{client_id[:64]}/{own}"


def sampling_json(parameters: Mapping[str, Any], tensor_json: str | None) -> str | None:
    """Request parameters and the ``sampling_parameters`` tensor as one JSON object."""
    merged = {k: v for k, v in parameters.items() if k not in TRANSPORT_PARAMETERS}
    if tensor_json:
        merged.update(json.loads(tensor_json))
    return json.dumps(merged) if merged else None


@dataclass
class _Counts:
    """The inner model's counts and finish reason, handed out with the responses.

    A streamed response carries the output tokens generated since the previous one it
    sent (the guard may hold text back, so responses do not match inner deltas), which
    add up to the inner model's total, as every LLM model's streamed counts do.
    """

    returns: ReturnFlags
    num_input_tokens: int = 0
    unsent_output_tokens: int = 0
    finish_reason: str | None = None

    def saw(self, event: InnerEvent) -> None:
        if event.num_input_tokens is not None:
            self.num_input_tokens = event.num_input_tokens
        self.unsent_output_tokens += event.num_output_tokens or 0
        if event.finish_reason not in (None, "", "None"):
            self.finish_reason = event.finish_reason

    def take(self, final: bool) -> dict[str, npt.NDArray[Any]]:
        tensors: dict[str, npt.NDArray[Any]] = {}
        if self.returns.finish_reason:
            tensors["finish_reason"] = text_tensor(str(self.finish_reason if final else None))
        if self.returns.num_input_tokens:
            tensors["num_input_tokens"] = np.array([self.num_input_tokens], dtype=np.uint32)
        if self.returns.num_output_tokens:
            tensors["num_output_tokens"] = np.array([self.unsent_output_tokens], dtype=np.uint32)
            self.unsent_output_tokens = 0
        return tensors


def _response(
    text: str,
    output: list[Finding],
    inputs: list[dict[str, Any]] | None,
    counts: dict[str, npt.NDArray[Any]] | None = None,
) -> dict[str, npt.NDArray[Any]]:
    tensors = {
        "text_output": text_tensor(text),
        "output_findings": text_tensor(findings_json(output)),
    }
    if inputs is not None:
        tensors["input_findings"] = text_tensor(json.dumps(inputs))
    return tensors | (counts or {})


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

    @classmethod
    def from_inputs(
        cls,
        inputs: Mapping[str, npt.NDArray[Any]],
        parameters: Mapping[str, Any],
        request_id: str,
        board: CancelBoard,
        inner_name: str = "vllm_model",
        cancellation_poll_s: float = 0.1,
    ) -> GuardedChat:
        """A client's request, as the Triton model receives it, ready to run.

        Validated (a :class:`RequestError` names the field) and the prompt redacted
        (:func:`guard_inputs`). Sampling keys given as request parameters are folded into
        the inner request's ``sampling_parameters`` JSON (the tensor wins on a clash, as in
        the schema), so ``/generate`` clients and tensor clients reach the LLM with the
        same settings. Here rather than in the model so the unit tests build a run the
        way the model does.
        """
        request = parse_request(inputs, parameters)
        guarded = guard_inputs(request, parameters)
        tensor_json = None
        if "sampling_parameters" in inputs:
            tensor_json = inputs["sampling_parameters"].reshape(-1)[0].decode("utf-8")
        sampling = sampling_json(parameters, tensor_json)
        if sampling is not None:
            guarded.tensors["sampling_parameters"] = np.array([sampling.encode()], dtype=np.object_)
        return cls(request, guarded, request_id, board, inner_name, cancellation_poll_s)

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
        except Exception as exc:  # the inner call itself failed (callee not loaded, …)
            why = str(exc) or type(exc).__name__
            outbox.close(None, InnerError(f"{self.inner_name}: {why}", None))
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
        counts = _Counts(self.request.returns)
        pending_input_findings: list[dict[str, Any]] | None = self.inputs.findings
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
            counts.saw(event)
            released, findings = guard.feed(event.text)
            if not self.request.stream:
                whole.append(released)
                found += findings
            elif released or findings:
                sent = _response(
                    released, findings, pending_input_findings, counts.take(final=False)
                )
                outbox.send(sent)
                pending_input_findings = None
        if outbox.is_cancelled():
            outbox.close(None, ClientCancelled("request cancelled by the client"))
            return "cancelled"
        rest, findings = guard.finish()
        if self.request.stream:
            last = _response(rest, findings, pending_input_findings, counts.take(final=True))
            outbox.close(last, None)
        else:
            text = self.inputs.echo + "".join(whole) + rest
            outbox.close(
                _response(text, found + findings, self.inputs.findings, counts.take(final=True)),
                None,
            )
        return "finished"
