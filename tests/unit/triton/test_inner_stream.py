"""A pipeline's inner stream: the server's gRPC address, and the messages it sends and reads."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from tritonforge.triton.inner_stream import (
    InnerStreams,
    _elements,
    _response,
    _tensor,
    server_grpc_url,
)


def _cmdline(tmp_path, *args: str) -> int:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cmdline").write_bytes(b"\0".join(a.encode() for a in args) + b"\0")
    return 42


def test_the_grpc_address_comes_from_the_servers_command_line(tmp_path) -> None:
    pid = _cmdline(tmp_path, "tritonserver", "--grpc-address=127.0.0.1", "--grpc-port=17185")
    assert server_grpc_url(pid, tmp_path) == "127.0.0.1:17185"


def test_triton_defaults_and_the_spaced_form(tmp_path) -> None:
    assert server_grpc_url(_cmdline(tmp_path, "tritonserver"), tmp_path) == "127.0.0.1:8001"
    other = tmp_path / "other"
    other.mkdir()
    pid = _cmdline(other, "tritonserver", "--grpc-port", "9001")
    assert server_grpc_url(pid, other) == "127.0.0.1:9001"


def test_a_server_without_grpc_is_refused(tmp_path) -> None:
    pid = _cmdline(tmp_path, "tritonserver", "--allow-grpc=false")
    with pytest.raises(RuntimeError, match="without gRPC"):
        server_grpc_url(pid, tmp_path)


def test_bytes_and_bool_tensors_are_sent_in_kserve_raw_form() -> None:
    spec, raw = _tensor("text_input", np.array(["héllo".encode()], dtype=np.object_))
    assert (spec.datatype, list(spec.shape)) == ("BYTES", [1])
    assert _elements(raw) == ["héllo".encode()]
    spec, raw = _tensor("stream", np.array([True]))
    assert spec.datatype == "BOOL" and raw == b"\x01"


def test_a_streamed_response_is_read_with_its_final_flag() -> None:
    message = service_pb2.ModelStreamInferResponse()
    response = message.infer_response
    response.outputs.add(name="text_output", datatype="BYTES", shape=[1])
    response.raw_output_contents.append(_tensor("t", np.array([b"Paris"], dtype=object))[1])
    response.outputs.add(name="num_output_tokens", datatype="UINT32", shape=[1])
    response.raw_output_contents.append(np.array([3], dtype=np.uint32).tobytes())
    response.parameters["triton_final_response"].bool_param = True
    read = _response(message)
    assert (read.text, read.num_output_tokens, read.final) == ("Paris", 3, True)
    error = _response(service_pb2.ModelStreamInferResponse(error_message="text_input: too long"))
    assert error.error == "text_input: too long" and error.final


class FakeCall:
    """A ``ModelStreamInfer`` call: yields the given messages, then waits until cancelled
    or until the request side is done (the client half-closed)."""

    def __init__(self, requests, messages, hold_open: bool) -> None:
        self.sent = next(requests)
        self._requests = requests
        self._messages = messages
        self._hold_open = hold_open
        self.cancelled = threading.Event()

    def __iter__(self):
        yield from self._messages
        if self._hold_open:
            self.cancelled.wait(10)
            raise RuntimeError("cancelled")
        for _ in self._requests:  # the server ends the call once the client half-closes
            pass

    def cancel(self) -> None:
        self.cancelled.set()


class FakeStub:
    def __init__(self, messages, hold_open: bool = False) -> None:
        self.messages, self.hold_open = messages, hold_open
        self.calls: list[tuple[FakeCall, tuple]] = []

    def ModelStreamInfer(self, requests, metadata=()):  # gRPC's method name
        call = FakeCall(requests, self.messages, self.hold_open)
        self.calls.append((call, metadata))
        return call


def _final(text: str) -> service_pb2.ModelStreamInferResponse:
    message = service_pb2.ModelStreamInferResponse()
    message.infer_response.outputs.add(name="text_output", datatype="BYTES", shape=[1])
    message.infer_response.raw_output_contents.append(_tensor("t", np.array([text.encode()]))[1])
    message.infer_response.parameters["triton_final_response"].bool_param = True
    return message


def test_a_stream_sends_its_request_and_context_and_ends_at_the_final() -> None:
    streams = InnerStreams.__new__(InnerStreams)
    streams._stub = FakeStub([_final("Paris")])
    tensors = {"text_input": np.array([b"capital?"], dtype=np.object_)}
    context = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    got = list(streams.stream("m", tensors, ["text_output"], "rid/x", context, metadata=context))
    assert [r.text for r in got if r is not None] == ["Paris"]
    call, metadata = streams._stub.calls[0]
    assert dict(metadata) == context and not call.cancelled.is_set()
    sent = call.sent
    assert (sent.model_name, sent.id) == ("m", "rid/x")
    assert [o.name for o in sent.outputs] == ["text_output"]
    assert sent.parameters["traceparent"].string_param == context["traceparent"]
    assert sent.parameters["triton_enable_empty_final_response"].bool_param


def test_a_silent_stream_yields_none_and_closing_it_cancels_the_request() -> None:
    streams = InnerStreams.__new__(InnerStreams)
    streams._stub = FakeStub([], hold_open=True)
    responses = streams.stream("m", {}, ["text_output"], "rid", idle_s=0.01)
    assert next(responses) is None  # nothing arrived: the caller looks at its client
    responses.close()
    call, _ = streams._stub.calls[0]
    assert call.cancelled.is_set()
