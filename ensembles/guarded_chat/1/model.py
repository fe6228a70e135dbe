"""guarded_chat: a decoupled model binding :mod:`tritonforge.pipelines.guarded_chat` to Triton.

``execute`` validates each request (errors name the field), then serves it on its own
thread and returns at once: the inner LLM's stream blocks the thread that reads it, so
reading it on Triton's thread would serialise all clients. The inner request goes to
``vllm_model`` over the server's own gRPC port (:mod:`tritonforge.triton.inner_stream`),
not through python_backend's BLS, which 24.10 cannot run from several threads: its
iterators deadlock the stub and free response tensors without the GIL. ``finalize``
cancels what is in flight through the :class:`~tritonforge.serving.cancellation.CancelBoard`
and waits for every thread, so an unload returns promptly and leaves no inner request
behind.

Only the outputs a client asked for are built: python_backend 24.10 drops the others
from a response inside ``send()``, after releasing the GIL.

Triton 2.51 workarounds W1 (the board), W4 (a thread per request) and W17 (no BLS from
threads), see docs/triton-2.51-workarounds.md.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import threading
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonforge.pipelines.guarded_chat import (
    RELAYED_RETURNS,
    ClientCancelled,
    GuardedChat,
    InnerError,
    InnerEvent,
    inner_request_id,
)
from tritonforge.serving.cancellation import CancelBoard
from tritonforge.serving.errors import EngineBusy, RequestError
from tritonforge.serving.tracing import TRACEPARENT
from tritonforge.triton.inner_stream import InnerStreams, server_grpc_url
from tritonforge.triton.model import traceparent_of, triton_error

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
#: A request error's message: the field's path, then the rule it broke.
_FIELD_ERROR = re.compile(r"^[a-z_]+(\.[a-z_0-9]+)*: ")


def _code_of(message: str) -> int | None:
    """The Triton error code of an inner error, read from its message.

    A gRPC stream's error carries no code, only the message the inner model's runtime
    made (``triton_error``): a request error names its field first
    (``text_input: prompt is …``), a busy or unavailable engine says so.
    """
    if _FIELD_ERROR.match(message):
        return pb_utils.TritonError.INVALID_ARG
    if any(word in message.lower() for word in ("is busy", "unavailable", "deadline")):
        return pb_utils.TritonError.UNAVAILABLE
    return None


def _error(exc: BaseException) -> Any:
    """The inner model's error keeps its code; the rest map as in every LLM model."""
    if isinstance(exc, InnerError) and exc.code is not None:
        return pb_utils.TritonError(str(exc), exc.code)
    if isinstance(exc, ClientCancelled):
        return pb_utils.TritonError(str(exc), pb_utils.TritonError.CANCELLED)
    return triton_error(exc)


class _Outbox:
    """A response sender as :class:`~tritonforge.pipelines.guarded_chat.Outbox`.

    Exactly one FINAL per request, and nothing after it (python_backend 24.10 deletes
    the response factory on FINAL; Triton keeps the model UNLOADING until every request
    has had one): a failed final send still sends a bare FINAL.

    Only the outputs the client requested go into a response: python_backend 24.10
    prunes the rest inside ``send()`` after releasing the GIL, and a pruned tensor's
    numpy arrays would be freed there, without it (W17).
    """

    def __init__(self, sender: Any, request_id: str, requested: set[str]) -> None:
        self._sender = sender
        self._request_id = request_id
        self._requested = requested  # Triton fills in every output when a client names none
        self._closed = False

    def _response(self, tensors: dict[str, np.ndarray] | None, error: Exception | None) -> Any:
        if error is not None:
            return pb_utils.InferenceResponse(error=_error(error))
        wanted = (tensors or {}).items()
        outputs = [pb_utils.Tensor(k, v) for k, v in wanted if k in self._requested]
        return pb_utils.InferenceResponse(output_tensors=outputs)

    def send(self, tensors: dict[str, np.ndarray]) -> None:
        if not self._closed:
            self._sender.send(self._response(tensors, None))

    def close(self, tensors: dict[str, np.ndarray] | None, error: Exception | None) -> None:
        """The final response; a cancelled request gets its CANCELLED error, then FINAL."""
        if self._closed:
            return
        self._closed = True
        try:
            if isinstance(error, ClientCancelled):
                self._sender.send(self._response(None, error))
                self._sender.send(flags=FINAL)
            else:
                self._sender.send(self._response(tensors, error), flags=FINAL)
        except Exception:
            with contextlib.suppress(Exception):
                self._sender.send(flags=FINAL)
            raise
        finally:
            # --log-verbose=1 shows every request's FINAL: a request missing from this
            # log is the one an UNLOADING model still waits for.
            pb_utils.Logger.log_verbose(f"[guarded_chat] FINAL sent for {self._request_id!r}")

    def is_cancelled(self) -> bool:
        return not self._closed and self._sender.is_cancelled()


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        parameters = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.inner_model = parameters.get("llm_model", "vllm_model")
        self.max_inflight = int(parameters.get("max_inflight", "64"))
        self.board = CancelBoard()  # Triton 2.51 workaround W1
        self._lock = threading.Lock()
        self._inflight: dict[str, threading.Thread] = {}
        self._closing = False
        self.inner = InnerStreams(server_grpc_url())  # Triton 2.51 workaround W17

    # --- the inner call ------------------------------------------------------------

    def _call_inner(self, tensors: dict[str, np.ndarray], request_id: str, traceparent: str | None):
        """The inner request, in the client request's trace: ``traceparent`` (Triton's span
        of this model, else the client's parameter) goes with the inner request.

        Between responses, an empty event every poll interval lets the run see its
        client's cancellation while the inner model is silent (queued, prefilling).
        """
        relayed = [name for name in RELAYED_RETURNS if f"return_{name}" in tensors]
        # Triton reads the context from the call's metadata (its spans of the inner request
        # join the trace), the runtime from the parameter when Triton does not trace.
        context = {TRACEPARENT: traceparent} if traceparent else {}
        responses = self.inner.stream(
            self.inner_model,
            tensors,
            ["text_output", *relayed],
            request_id,
            parameters=context,
            metadata=context,
        )
        for response in responses:
            if response is None:
                yield InnerEvent()  # nothing yet: a chance to look at the client
            elif response.error is not None:
                yield InnerEvent(error=response.error, code=_code_of(response.error))
            elif response.text is not None or response.num_output_tokens is not None:
                yield InnerEvent(
                    text=response.text or "",
                    finish_reason=response.finish_reason,
                    num_input_tokens=response.num_input_tokens,
                    num_output_tokens=response.num_output_tokens,
                )

    # --- Triton entry points -------------------------------------------------------

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            outbox = _Outbox(
                request.get_response_sender(),
                request.request_id(),
                set(request.requested_output_names()),
            )
            try:
                inputs = {t.name(): t.as_numpy() for t in request.inputs()}
                raw = request.parameters()
                parameters = json.loads(raw) if isinstance(raw, str) and raw else {}
                chat = GuardedChat.from_inputs(
                    inputs,
                    parameters,
                    inner_request_id(request.request_id()),  # for the board: workaround W1
                    self.board,
                    self.inner_model,
                )
                self._start(chat, outbox, traceparent_of(request, parameters))
            except Exception as exc:
                if not isinstance(exc, RequestError | EngineBusy):
                    pb_utils.Logger.log_error(f"[guarded_chat] execute failed: {exc!r}")
                outbox.close(None, exc)
        return None

    def _start(self, chat: GuardedChat, outbox: _Outbox, traceparent: str | None) -> None:
        # Triton 2.51 workaround W4, see docs/triton-2.51-workarounds.md
        with self._lock:
            if self._closing:
                raise EngineBusy("guarded_chat is unloading; no new requests are accepted")
            if len(self._inflight) >= self.max_inflight:
                raise EngineBusy.at_bound("guarded_chat", self.max_inflight)
            thread = threading.Thread(
                target=self._serve,
                args=(chat, outbox, traceparent),
                name="guarded-chat",
                daemon=True,
            )
            self._inflight[chat.request_id] = thread
        thread.start()

    def _serve(self, chat: GuardedChat, outbox: _Outbox, traceparent: str | None) -> None:
        try:
            chat.run(functools.partial(self._call_inner, traceparent=traceparent), outbox)
        except Exception as exc:  # a bug here must still end the client's request
            pb_utils.Logger.log_error(f"[guarded_chat] request failed: {exc!r}")
            try:
                outbox.close(None, exc)
            except Exception as send_exc:
                pb_utils.Logger.log_error(f"[guarded_chat] could not send error: {send_exc!r}")
        finally:
            with self._lock:
                self._inflight.pop(chat.request_id, None)

    def finalize(self) -> None:
        with self._lock:
            self._closing = True
            inflight = dict(self._inflight)
        for request_id in inflight:
            self.board.cancel(request_id)  # Triton 2.51 workaround W1
        for thread in inflight.values():
            thread.join(timeout=20)
        self.board.tidy()
        self.inner.close()
