"""The frontend's graceful stop: streams still open when the grace period ends get an
error, never a bare cut (tritonforge/openai/shutdown.py). No server: the gRPC call is a
stand-in that behaves as grpc.aio's does when cancelled (its pending read raises
CancelledError in the reader's task)."""

from __future__ import annotations

import asyncio

import pytest

from tritonforge.openai import triton_client
from tritonforge.openai.errors import OpenAIError
from tritonforge.openai.shutdown import GracefulServer, shutting_down
from tritonforge.openai.translate import TritonRequest
from tritonforge.openai.triton_client import TritonGateway


class CallStandIn:
    """A Triton stream call that never answers until it is cancelled."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    def __aiter__(self) -> CallStandIn:
        return self

    async def __anext__(self) -> tuple[object, object]:
        await self.cancelled.wait()
        raise asyncio.CancelledError  # grpc.aio, locally cancelled

    def cancel(self) -> bool:
        self.cancelled.set()
        return True


class ClientStandIn:
    def __init__(self) -> None:
        self.calls: list[CallStandIn] = []

    def stream_infer(self, _requests: object, headers: object = None) -> CallStandIn:
        self.calls.append(CallStandIn())
        return self.calls[-1]


def _gateway(monkeypatch: pytest.MonkeyPatch) -> tuple[TritonGateway, ClientStandIn]:
    gateway = TritonGateway("127.0.0.1:1")
    client = ClientStandIn()
    gateway._client = client  # type: ignore[assignment]
    monkeypatch.setattr(triton_client, "request_inputs", lambda _request: [])
    return gateway, client


REQUEST = TritonRequest("text_input", "Hi", {}, {})


async def _read(stream: triton_client.TritonStream) -> object:
    try:
        return await anext(stream)
    except OpenAIError as error:
        return error


def test_a_stream_waiting_for_its_next_token_ends_with_the_shutdown_error(monkeypatch) -> None:
    async def scenario() -> None:
        gateway, client = _gateway(monkeypatch)
        stream = gateway.stream("m", REQUEST)
        reader = asyncio.ensure_future(_read(stream))
        await asyncio.sleep(0)  # the reader waits on the call
        assert gateway.end_streams(shutting_down(30)) == 1
        error = await reader
        assert isinstance(error, OpenAIError) and error.status == 503
        assert "shutting down" in error.message and "30 s" in error.message
        assert client.calls[0].cancelled.is_set()  # Triton cancels the request
        with pytest.raises(StopAsyncIteration):  # the error is given once
            await anext(stream)

    asyncio.run(scenario())


def test_a_stream_between_reads_and_one_opened_after_the_end_get_the_error_too(
    monkeypatch,
) -> None:
    async def scenario() -> None:
        gateway, _ = _gateway(monkeypatch)
        before = gateway.stream("m", REQUEST)
        gateway.end_streams(shutting_down(5))
        after = gateway.stream("m", REQUEST)
        for stream in (before, after):
            error = await _read(stream)
            assert isinstance(error, OpenAIError) and error.status == 503
            assert not stream.running

    asyncio.run(scenario())


def test_a_reader_cancelled_itself_is_not_turned_into_an_error(monkeypatch) -> None:
    async def scenario() -> None:
        gateway, _ = _gateway(monkeypatch)
        stream = gateway.stream("m", REQUEST)
        reader = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0)
        reader.cancel()  # the client went away: the task's own cancellation
        gateway.end_streams(shutting_down(5))
        with pytest.raises(asyncio.CancelledError):
            await reader

    asyncio.run(scenario())


def test_the_server_ends_what_is_in_flight_once_the_grace_period_is_over() -> None:
    import uvicorn
    from uvicorn.lifespan.off import LifespanOff

    ended: list[float] = []

    async def scenario() -> None:
        server = GracefulServer(
            uvicorn.Config(app=None, lifespan="off"), 0.05, lambda: ended.append(1) or 1
        )
        server.servers = []
        server.lifespan = LifespanOff(server.config)
        server.config.timeout_graceful_shutdown = 1
        # A connection whose request runs until the grace period's end answers it.
        server.server_state.tasks.add(asyncio.ensure_future(_until(lambda: bool(ended))))
        await server.shutdown()

    asyncio.run(scenario())
    assert ended == [1]


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.01)
