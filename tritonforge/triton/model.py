"""The Triton edge: ``TritonPythonModel`` for any engine, and nothing engine-specific.

This is the only module that touches ``triton_python_backend_utils`` for LLM models
(``embedding.py`` beside it is the embedding models' edge). It turns Triton
requests into input arrays for :func:`parse_request`, hands parsed requests to the
:class:`Runtime`, and turns the runtime's outputs and errors into Triton responses.
Clients speaking another request dialect (:mod:`tritonforge.serving.dialects`) have their
tensors mapped onto the common schema here, before parsing. A request carrying
``lora_control`` loads or unloads a LoRA adapter instead of generating
(:mod:`tritonforge.serving.lora_control`). A backend's ``model.py``
is two lines: ``make_model("package.module:SomeEngine")`` (plus its dialect, if it has
one). The engine is named, not imported: Triton's Python backend runs
``auto_complete_config`` in a stub of its own before the model's real stub starts, and
importing an engine there (vLLM brings torch) would pay each load's import twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pkgutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import triton_python_backend_utils as pb_utils

from tritonforge.engines.base import Engine
from tritonforge.engines.config import load_engine_config
from tritonforge.heap import freeze_startup_heap
from tritonforge.serving.admission import model_defaults
from tritonforge.serving.cancellation import CancelBoard
from tritonforge.serving.dialects import COMMON, Dialect
from tritonforge.serving.errors import DeadlineExceeded, EngineBusy, EngineUnavailable, RequestError
from tritonforge.serving.lora_control import AdapterControl, ControlRequest, parse_control
from tritonforge.serving.outbox import StreamPolicy
from tritonforge.serving.request_ids import check_request_id, new_request_id
from tritonforge.serving.request_log import log_requests_from_env
from tritonforge.serving.restarts import RestartLedger, RestartPolicy
from tritonforge.serving.runtime import Runtime
from tritonforge.serving.schema import parse_request
from tritonforge.serving.tracing import (
    TRACEPARENT,
    context_traceparent,
    parse_traceparent,
    runtime_tracer,
)
from tritonforge.triton.admission_metrics import model_admission
from tritonforge.triton.metrics import TritonMetrics
from tritonforge.triton.reaper import start_reaper
from tritonforge.triton.server_watch import watch_server
from tritonforge.triton.tensors import LLM_INPUTS, LLM_OUTPUTS


def triton_error(exc: BaseException, request_id: str = "") -> Any:
    """Map core exceptions to Triton error codes clients can act on; the message names
    the request's id (``request_id``) so a client's report finds its server log lines."""
    if isinstance(exc, RequestError):
        code = pb_utils.TritonError.INVALID_ARG
    elif isinstance(exc, EngineBusy | EngineUnavailable | DeadlineExceeded):
        # python_backend 24.10 has no DEADLINE_EXCEEDED; Triton answers its own expired
        # request timeouts UNAVAILABLE too (HTTP 503, gRPC UNAVAILABLE).
        code = pb_utils.TritonError.UNAVAILABLE
    elif isinstance(exc, asyncio.CancelledError):
        code = pb_utils.TritonError.CANCELLED
    else:
        code = pb_utils.TritonError.INTERNAL
    message = str(exc) or type(exc).__name__
    if request_id:
        message = f"{message} [request {request_id}]"
    return pb_utils.TritonError(message, code)


class TensorCache:
    """Triton tensors of one-element outputs whose values recur, shared by the response threads.

    Building a ``pb_utils.Tensor`` is most of what a streamed response costs the stub
    (dtype resolution, BYTES serialisation, a shared-memory block allocated, copied and
    freed again), and most responses repeat a value already sent: a count of 1 token, a
    common token's text. python_backend writes a tensor to shared memory on its first
    send and sends that block again on every later one, so a tensor built once can go
    out many times, from any thread. Only that first write is unsafe to share (it runs
    outside the GIL): a new tensor is used by the thread that built it until its first
    send returns (:meth:`keep`), and only then joins the shared cache.

    One cache for all threads, not one each: every thread finds the tensors the others
    built. Past ``limit`` entries the oldest leave first, so a long tail of rare texts
    never empties it of the common ones; reading takes no lock. An entry holds a few
    hundred bytes of the stub's shared memory.
    """

    def __init__(self, limit: int = 8192) -> None:
        self.limit = limit
        self._shared: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()  # taken to add and evict, never to read

    def tensors(self, arrays: dict[str, npt.NDArray[Any]]) -> tuple[list[Any], list[Any]]:
        """The tensors for ``arrays``, and the new recurring ones to :meth:`keep` once sent."""
        shared = self._shared
        out = []
        fresh = []
        for name, array in arrays.items():
            key = _recurring(name, array)
            tensor = None if key is None else shared.get(key)
            if tensor is None:
                tensor = pb_utils.Tensor(name, array)
                if key is not None:
                    fresh.append((key, tensor))
            out.append(tensor)
        return out, fresh

    def clear(self) -> None:
        """Free every cached tensor, while the stub can still free shared memory.

        Called from ``finalize``: a tensor left for the interpreter's exit is freed after
        python_backend has torn its shared memory down, and the stub segfaults.
        """
        with self._lock:
            self._shared = {}

    def keep(self, fresh: list[Any]) -> None:
        """Share tensors whose first send returned (their shared memory is written)."""
        with self._lock:
            shared = self._shared
            for key, tensor in fresh:
                shared[key] = tensor
            while len(shared) > self.limit:
                del shared[next(iter(shared))]


#: Longest text worth caching: a token or two, a finish reason.
_SHORT_BYTES = 32


def _recurring(name: str, array: npt.NDArray[Any]) -> tuple[Any, ...] | None:
    """A cache key for values likely to recur (short text, whole numbers), else None."""
    if array.size != 1 or array.dtype.kind not in "Oiu":
        return None
    value = array.item(0)
    if array.dtype.kind == "O" and not (
        isinstance(value, bytes | str) and len(value) <= _SHORT_BYTES
    ):
        return None
    return (name, array.dtype.char, array.shape, value)


class TritonChannel:
    """A request's response sender, as the runtime's :class:`~tritonforge.serving.runtime.Channel`.

    A request is cancelled when Triton says so or when the BLS model that sent it
    marked its id on the :class:`CancelBoard` (Triton 24.10 BLS cannot cancel):
    Triton 2.51 workaround W1 (and W2 in :meth:`send`), see docs/triton-2.51-workarounds.md.

    Exactly one response carries the FINAL flag, and once it is sent the sender is
    never touched again: python_backend 24.10 deletes a request's response factory on
    FINAL, and a later ``is_cancelled()`` or ``send()`` makes the parent look up a
    factory that is gone. Triton keeps a model UNLOADING until every request has had
    its FINAL, so a lost one wedges the unload.
    """

    _board = CancelBoard()  # Triton 2.51 workaround W1

    def __init__(self, sender: Any, cache: TensorCache, request_id: str = "") -> None:
        self._sender = sender
        self._cache = cache
        self._request_id = request_id
        #: The request's id in the runtime (Triton's, or the one made for it): its errors name it.
        self.request_id = request_id
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once the FINAL response went out (or was attempted)."""
        return self._closed

    def send(
        self, tensors: dict[str, npt.NDArray[Any]] | None, error: BaseException | None, final: bool
    ) -> None:
        if self._closed:
            return
        self._closed = final
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        if isinstance(error, asyncio.CancelledError) and self._board.is_cancelled(self._request_id):
            # The BLS caller cancelled and expects no more: end quietly. An error response
            # sent after execute() returned never reaches a python-backend 24.10 BLS
            # caller and wedges its unload.
            # Triton 2.51 workaround W2, see docs/triton-2.51-workarounds.md.
            self._sender.send(flags=flags)
            return
        fresh: list[Any] = []
        if error is not None:
            response = pb_utils.InferenceResponse(error=triton_error(error, self.request_id))
        elif tensors is not None:
            outputs, fresh = self._cache.tensors(tensors)
            response = pb_utils.InferenceResponse(output_tensors=outputs)
        else:
            self._sender.send(flags=flags)
            return
        try:
            # ``outputs`` keeps every tensor referenced until send() returns: 24.10 drops
            # outputs the client did not request inside send(), without the GIL, and must
            # not free them there (Triton 2.51 workaround W17).
            self._sender.send(response, flags=flags)
            if fresh:
                self._cache.keep(fresh)
        except Exception:
            if final:  # the response could not go out: the FINAL flag still must
                with contextlib.suppress(Exception):
                    self._sender.send(flags=flags)
            raise

    def is_cancelled(self) -> bool:
        if self._closed:
            return False  # finished: its response factory no longer exists
        return self._sender.is_cancelled() or self._board.is_cancelled(self._request_id)


def triton_timeout_s(request: Any) -> float | None:
    """Triton's own request timeout in seconds, None if the client set none.

    Clients set it as the ``timeout`` request parameter in microseconds (tritonclient's
    ``timeout=``); Triton's frontends consume it and python_backend hands it over as
    ``request.timeout()``, 0 meaning none. Triton itself enforces it only in a
    dynamic batcher's queue, which these models do not have: the runtime does.
    """
    micros = request.timeout()
    return micros / 1_000_000 if micros else None


def request_id_of(request: Any) -> str:
    """The request's id: the client's (Triton's request ``id``), checked, or a new one."""
    given = request.request_id()
    return check_request_id(given, "id") if given else new_request_id()


def traceparent_of(request: Any, parameters: dict[str, Any]) -> str | None:
    """The request's trace context: Triton's own span of it when Triton traces
    (``--trace-config mode=opentelemetry``), else a ``traceparent`` request parameter.

    Triton 2.51 reads a gRPC call's ``traceparent`` metadata past its end (the value is
    not NUL-terminated) and, when the next bytes are not NUL, starts a trace of its own;
    the metadata forwarded as a parameter (``--grpc-header-forward-pattern``) is exact.
    When the two name different traces, Triton's span is in the wrong one, so the
    parameter's span — the client's — is the parent. Triton 2.51 workaround W18, see
    docs/triton-2.51-workarounds.md.
    """
    given = parameters.get(TRACEPARENT)
    given = given if isinstance(given, str) else None
    with contextlib.suppress(Exception):  # the stub has no trace for this request
        if (found := context_traceparent(request.trace().get_context())) is not None:
            client, triton = parse_traceparent(given), parse_traceparent(found)
            if client is None or triton is None or client.trace_id == triton.trace_id:
                return found
    return given


def _request_parameters(request: Any) -> dict[str, Any]:
    raw = request.parameters()
    if not raw:
        return {}
    value = json.loads(raw) if isinstance(raw, str) else raw
    return value if isinstance(value, dict) else {}


class LLMModel:
    """Base of every LLM ``TritonPythonModel``; subclasses set ``engine_name``."""

    #: ``"package.module:Class"`` of the engine, imported by :meth:`initialize` only.
    engine_name: str
    #: The request dialect clients may speak besides the common schema.
    dialect: Dialect = COMMON

    @classmethod
    def auto_complete_config(cls, config: Any) -> Any:
        present = config.as_dict()
        have_inputs = {i["name"] for i in present.get("input", [])}
        have_outputs = {o["name"] for o in present.get("output", [])}
        for spec in [*LLM_INPUTS, *cls.dialect.inputs]:
            if spec["name"] not in have_inputs:
                config.add_input(spec)
        for spec in LLM_OUTPUTS:
            if spec["name"] not in have_outputs:
                config.add_output(spec)
        # Decoupled: the engine batches on its own and streams many responses per request.
        config.set_model_transaction_policy({"decoupled": True})
        config.set_max_batch_size(0)
        return config

    def initialize(self, args: dict[str, str]) -> None:
        model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise ValueError(
                f"{args['model_name']}: set model_transaction_policy {{ decoupled: true }} in "
                "config.pbtxt; LLM models stream and batch inside the engine"
            )
        parameters = {
            key: value.get("string_value", "")
            for key, value in model_config.get("parameters", {}).items()
        }
        version_dir = Path(args["model_repository"]) / args["model_version"]
        engine_class: type[Engine] = pkgutil.resolve_name(self.engine_name)
        engine_config = load_engine_config(version_dir, engine_class.config_file.name)
        engine = engine_class.from_config(engine_config, version_dir)
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.model_name = args["model_name"]
        self.restart_policy = RestartPolicy.from_parameters(parameters)
        self.restarts = RestartLedger(self.model_name)
        self._restart_cause: str | None = None
        self.tensor_cache = TensorCache()
        self.metrics = TritonMetrics(pb_utils, engine.metric_prefix, labels)
        self.metrics.count_restarts(self.restarts.total())  # carried over from old stubs
        self.defaults = model_defaults(parameters)  # default_slo_ttft_ms, …: checked at load
        admission, self.admission_metrics = model_admission(pb_utils, engine, parameters, labels)
        # Whatever ends this stub, its engine's processes end with it (reaper.py).
        self._reaper = start_reaper()
        stream_policy = StreamPolicy.from_parameters(parameters)
        self.runtime = Runtime(
            engine,
            self.metrics,
            pb_utils.Logger,
            max_inflight=int(parameters.get("max_inflight", "256")),
            cancellation_poll_s=stream_policy.cancellation_poll_s(engine.cancellation_poll_s),
            on_engine_failure=self._engine_failed,
            shutdown_watch=watch_server(),
            stream_policy=stream_policy,
            admission=admission,
            tracer=runtime_tracer(args["model_name"]),
            log_requests=log_requests_from_env(),
        )
        self.runtime.start()
        self.metrics.size_by_context(engine.max_context)
        self.adapter_control = AdapterControl(engine, version_dir)
        freeze_startup_heap()  # no full GC pass walks the engine's objects again (heap.py)

    def _control(self, request: ControlRequest, channel: TritonChannel) -> None:
        """Run a LoRA control request on the engine's loop; answer it when it is done.

        ``execute`` returns at once: a load reads weights, and the model's other
        requests must not wait behind it.
        """

        def answer(done: Any) -> None:
            error = done.exception()
            if error is not None:
                channel.send(None, error, True)
                return
            result = done.result()
            pb_utils.Logger.log_info(
                f"[tritonforge] {self.model_name}: lora_control {request.action} "
                f"{request.name or ''}: now serving {len(result['adapters'])} adapter(s)"
            )
            text = np.array([json.dumps(result).encode("utf-8")], dtype=np.object_)
            channel.send({"text_output": text}, None, True)

        self.runtime.run_on_loop(self.adapter_control.run(request)).add_done_callback(answer)

    def _engine_failed(self, cause: str) -> None:
        """The engine died (a response thread): leave service now, come back in finalize.

        Unloading itself makes Triton report the model not ready at once; Triton then
        calls ``finalize`` when the requests the runtime just failed have all had their
        final response, and ``finalize`` loads the model again (see restarts.py).
        """
        if self.restart_policy.max_restarts == 0:
            pb_utils.Logger.log_error(
                f"[tritonforge] {self.model_name}: engine failed ({cause}); restarts are off "
                "(engine_restart_max 0): unloading it"
            )
        self._restart_cause = cause
        try:
            pb_utils.unload_model(self.model_name)
        except Exception as exc:  # not in explicit model-control mode
            self._restart_cause = None
            pb_utils.Logger.log_error(
                f"[tritonforge] {self.model_name}: engine failed ({cause}) and the model "
                f"cannot take itself out of service ({exc}); run tritonserver with "
                "--model-control-mode=explicit. Until then it answers UNAVAILABLE."
            )

    def _restart(self) -> None:
        """Load this model again, after a backoff, unless it restarted too often."""
        policy = self.restart_policy
        times = self.restarts.record()
        attempt = RestartLedger.attempt(times, policy)
        if attempt > policy.max_restarts:
            pb_utils.Logger.log_error(
                f"[tritonforge] {self.model_name}: engine failed ({self._restart_cause}); "
                f"not restarting: {attempt - 1} restart(s) in the last {policy.window_s:.0f} s "
                f"(engine_restart_max {policy.max_restarts}). Load it again by hand."
            )
            return
        delay = policy.delay_s(attempt)
        pb_utils.Logger.log_error(
            f"[tritonforge] {self.model_name}: engine failed ({self._restart_cause}); "
            f"restart {attempt}/{policy.max_restarts} in {delay:.1f} s"
        )
        time.sleep(delay)
        try:
            pb_utils.load_model(self.model_name)
        except Exception as exc:  # the server is shutting down, or the load failed
            pb_utils.Logger.log_error(f"[tritonforge] {self.model_name}: reload failed: {exc}")

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            channel = TritonChannel(
                request.get_response_sender(), self.tensor_cache, request.request_id()
            )
            try:
                raw = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
                control = parse_control(raw)
                if control is not None:
                    self._control(control, channel)
                    continue
                request_id = channel.request_id = request_id_of(request)
                inputs, dialect_sampling = self.dialect.translate(raw)
                parameters = _request_parameters(request)
                traceparent = parameters.pop(TRACEPARENT, None)  # transport, not sampling
                if self.runtime.tracer is not None:
                    traceparent = traceparent_of(request, {TRACEPARENT: traceparent})
                parsed = parse_request(inputs, parameters, dialect_sampling, self.defaults)
                self.runtime.submit(
                    parsed, channel, triton_timeout_s(request), request_id, traceparent
                )
            except (RequestError, EngineBusy, EngineUnavailable) as exc:
                channel.send(None, exc, True)
            except Exception as exc:
                pb_utils.Logger.log_error(
                    f"[tritonforge] request {channel.request_id or '-'}: execute failed: {exc!r}"
                )
                channel.send(None, exc, True)
        return None

    def finalize(self) -> None:
        self.runtime.stop()  # the response threads are done: nothing records or sends any more
        self.tensor_cache.clear()  # Triton 2.51 workaround W5, see docs/triton-2.51-workarounds.md
        self.metrics.close()  # Triton 2.51 workaround W5, see docs/triton-2.51-workarounds.md
        if self.admission_metrics is not None:
            self.admission_metrics.close()
        if self._restart_cause is not None and self.restart_policy.max_restarts > 0:
            self._restart()


def make_model(engine_name: str, dialect: Dialect = COMMON) -> type[LLMModel]:
    """The ``TritonPythonModel`` class for one engine (``"package.module:Class"``, imported
    when the model loads) and the request dialect it accepts."""
    attributes = {"engine_name": engine_name, "dialect": dialect}
    return type("TritonPythonModel", (LLMModel,), attributes)
