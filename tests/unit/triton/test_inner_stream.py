"""A pipeline's inner stream: the server's gRPC address, and the messages it sends and reads."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from tritonforge.triton.inner_stream import _elements, _response, _tensor, server_grpc_url


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
