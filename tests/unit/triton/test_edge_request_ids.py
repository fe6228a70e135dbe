"""The Triton edge's part of request ids and trace context: Triton's request id checked or
made, errors naming it, and the trace context taken from Triton's own trace first (unless
it lost the client's), else a ``traceparent`` request parameter. A stand-in for
triton_python_backend_utils; no server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace

import pytest

from tests.fakes import edge_module
from tritonforge.serving.errors import RequestError

TRITON_SPAN = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"
CLIENT_SPAN = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def edge(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    class TritonError:
        INTERNAL, UNAVAILABLE, INVALID_ARG, CANCELLED = range(4)

        def __init__(self, message: str, code: int) -> None:
            self.message, self.code = message, code

    yield from edge_module(monkeypatch, TritonError=TritonError)


def _request(request_id: str = "", context: str | None = None) -> SimpleNamespace:
    trace = SimpleNamespace(get_context=lambda: context)
    return SimpleNamespace(request_id=lambda: request_id, trace=lambda: trace)


def test_tritons_request_id_is_the_requests(edge: ModuleType) -> None:
    assert edge.request_id_of(_request("client-1")) == "client-1"
    made = edge.request_id_of(_request(""))
    assert len(made) == 32 and made != edge.request_id_of(_request(""))


def test_an_unusable_triton_id_is_refused_naming_id(edge: ModuleType) -> None:
    with pytest.raises(RequestError) as refused:
        edge.request_id_of(_request("has space"))
    assert refused.value.field == "id"


def test_an_error_names_the_request(edge: ModuleType) -> None:
    error = RequestError("sampling_parameters.top_p", "must be in (0, 1]")
    mapped = edge.triton_error(error, "client-1")
    assert mapped.message == f"{error} [request client-1]"
    assert mapped.code == edge.pb_utils.TritonError.INVALID_ARG
    assert edge.triton_error(error).message == str(error)  # no id: the message alone


def test_tritons_own_trace_context_comes_first(edge: ModuleType) -> None:
    context = json.dumps({"traceparent": TRITON_SPAN})
    assert edge.traceparent_of(_request(context=context), {"traceparent": CLIENT_SPAN}) == (
        TRITON_SPAN
    )


def test_without_tritons_trace_the_parameter_is_the_context(edge: ModuleType) -> None:
    assert edge.traceparent_of(_request(), {"traceparent": CLIENT_SPAN}) == CLIENT_SPAN
    assert edge.traceparent_of(_request(), {}) is None

    def no_trace() -> None:
        raise RuntimeError("this request has no trace")

    broken = SimpleNamespace(request_id=lambda: "", trace=no_trace)
    assert edge.traceparent_of(broken, {"traceparent": CLIENT_SPAN}) == CLIENT_SPAN


def test_a_trace_triton_lost_gives_way_to_the_clients(edge: ModuleType) -> None:
    """Triton 2.51 sometimes starts a trace of its own despite the client's metadata; the
    forwarded ``traceparent`` parameter then names the parent, so the runtime's spans stay
    in the client's trace."""
    own = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    context = json.dumps({"traceparent": own})
    assert edge.traceparent_of(_request(context=context), {"traceparent": CLIENT_SPAN}) == (
        CLIENT_SPAN
    )
    assert edge.traceparent_of(_request(context=context), {}) == own  # nothing to prefer
    garbled = {"traceparent": "not-a-traceparent"}
    assert edge.traceparent_of(_request(context=context), garbled) == own
