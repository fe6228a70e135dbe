"""Is tritonserver still answering gRPC streams? A cheap probe, and when to give up on it.

Triton 2.51 was seen to stop answering every gRPC stream while unary gRPC and HTTP calls
still worked. Its process was alive and its readiness endpoints said ready, so nothing
else the supervisor watches would notice, yet every streamed request (the OpenAI
frontend's and genai-perf's alike) waited forever. So, while the server is ready, the
supervisor opens one bidirectional stream every ``period_s``, sends one request and
half-closes, as the OpenAI frontend does for each of its requests, and wants the call to
end within ``timeout_s``. ``failures`` probes in a row that do not make it are taken for a
crash (:data:`STREAMS_STALLED`).

The request goes to :data:`PROBE_MODEL`, the C++ tokenizer ``make serve`` loads by
default: one short text to tokenize costs well under a millisecond and no engine work.
A server that does not serve it answers the request with an error on the same stream;
that is an answer too — the probe asks whether streams are served, not whether a model
works — and the path is the stream's own (read, dispatch, response written back).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

#: The model the probe's request names (see the module's docstring for why).
PROBE_MODEL = "preprocessing"
#: The cause a restart after stalled streams is logged and counted under.
STREAMS_STALLED = "gRPC streams stalled"


def stream_answers(grpc_url: str, timeout_s: float, model: str = PROBE_MODEL) -> bool:
    """One request on a new bidirectional stream: answered, and the call ended cleanly,
    within ``timeout_s``? (gRPC's deadline bounds the whole call, connection included.)"""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    text = service_pb2.InferTensorContents(bytes_contents=[b"probe"])
    request = service_pb2.ModelInferRequest(
        model_name=model,
        id="tritonforge-stream-probe",
        inputs=[
            service_pb2.ModelInferRequest.InferInputTensor(
                name="text_input", datatype="BYTES", shape=[1, 1], contents=text
            )
        ],
    )
    with grpc.insecure_channel(grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            answers = list(stub.ModelStreamInfer(iter([request]), timeout=timeout_s))
        except grpc.RpcError:
            return False  # deadline passed, connection refused or reset
    return bool(answers)


@dataclass
class StreamProbe:
    """When the probe runs, and how many failures in a row mean the streams are stalled.

    Defaults keep a busy server on two cores well clear of a false alarm: a probe's
    request is answered within milliseconds by a serving server, so ``timeout_s`` leaves
    a wide margin for a loaded machine, and ``failures`` in a row at ``period_s`` mean
    streams went unanswered for about half a minute or more before the restart.
    ``period_s`` or ``failures`` 0 turns the probe off.
    """

    period_s: float = 10.0
    timeout_s: float = 5.0
    failures: int = 3
    check: Callable[[str, float], bool] = stream_answers
    _next_at: float = 0.0
    _failed: int = 0

    @property
    def enabled(self) -> bool:
        return self.period_s > 0 and self.failures > 0

    @property
    def failed(self) -> int:
        """Failures in a row so far."""
        return self._failed

    def begin(self, now: float) -> None:
        """A (re)started server became ready: no failures yet, the first probe one period on."""
        self._failed = 0
        self._next_at = now + self.period_s

    def due(self, now: float) -> bool:
        return self.enabled and now >= self._next_at

    def run(self, grpc_url: str, now: float) -> bool:
        """Probe now: True if it answered. The next probe is one period after this one."""
        self._next_at = now + self.period_s
        return self.check(grpc_url, self.timeout_s)

    def record(self, answered: bool) -> bool:
        """Count a probe's outcome; True once ``failures`` in a row have failed."""
        self._failed = 0 if answered else self._failed + 1
        return self._failed >= self.failures
