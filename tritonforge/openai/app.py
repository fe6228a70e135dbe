"""The HTTP routes: OpenAI's API over :class:`~tritonforge.openai.triton_client.TritonGateway`.

A request's life: parse the body (malformed JSON or a wrong structure is a 400 in
OpenAI's shape, never FastAPI's 422), look the model up (404), translate it, open the
Triton stream and wait for its *first* response before answering. Waiting first means
an error the model raises up front (a bad argument, a busy queue, a prompt too long for
the context) gets its real status code even on a streamed request, rather than a 200
followed by an error event; it costs nothing, since nothing could be sent earlier.

A client that goes away cancels its Triton call (and so its engine request) whether it
was waiting for a non-streamed answer, for the first token, or reading the stream: a
watcher waits for ASGI's ``http.disconnect`` beside the work and cancels it.

``/health`` and ``/health/ready`` answer 200 while at least one model this frontend
serves is ready (per model, not Triton's server-wide readiness); ``/metrics`` serves
Triton's metrics on this port.

While Triton is down (the launcher restarting it after a crash) a chat or completion
request that has sent its client nothing yet — in flight when Triton died, or arriving
during the outage — waits for its model on the restarted server and is sent again
(carry_over.py: same request id, deadline counted from its arrival, a bounded number
waiting); a stream that had sent tokens ends with an error event naming the restart and
``[DONE]``, never replayed. The other routes answer 503 with ``Retry-After`` meanwhile.

Nothing here logs prompts or generated text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import aiohttp
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from tritonforge.heap import freeze_startup_heap
from tritonforge.openai import carry_over, embeddings, request_context, tools, translate
from tritonforge.openai.adapters import (
    AdapterCatalogue,
    LoadLoRAAdapterRequest,
    UnloadLoRAAdapterRequest,
)
from tritonforge.openai.carry_over import CarryOver, CarryOverSettings, Clock
from tritonforge.openai.chunks import TextChunks
from tritonforge.openai.errors import (
    TRITON_DOWN_RETRY_AFTER_S,
    OpenAIError,
    TritonDown,
    internal,
    invalid,
    model_not_found,
    unavailable,
    unreachable,
)
from tritonforge.openai.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from tritonforge.openai.responses import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChoiceDelta,
    Completion,
    CompletionChoice,
    CompletionChunk,
    OpenAIObject,
    to_json,
)
from tritonforge.openai.tools import ToolCall, ToolPlan
from tritonforge.openai.translate import ModelOutput, ResponseIds, TritonRequest, Usage
from tritonforge.openai.triton_client import TritonGateway, TritonStream
from tritonforge.serving.request_log import log_requests_from_env

T = TypeVar("T")
B = TypeVar("B", bound=BaseModel)
#: Chat answers without max_tokens get this many at most (lowered to what fits the
#: model's context when the prompt is long): the schema's own default is 16, which
#: suits completions (OpenAI's default there too) but truncates every chat answer.
DEFAULT_CHAT_MAX_TOKENS = 1024


class ClientGone(Exception):
    """The HTTP client disconnected before its answer was ready."""


def _sse(obj: OpenAIObject) -> bytes:
    return b"data: " + to_json(obj) + b"\n\n"


_DONE = b"data: [DONE]\n\n"


def _json(obj: OpenAIObject, status: int = 200) -> Response:
    return Response(to_json(obj), status_code=status, media_type="application/json")


def error_response(error: OpenAIError) -> Response:
    response = _json(error.body(), error.status)
    if error.retry_after_s is not None:
        response.headers["Retry-After"] = str(error.retry_after_s)
    return response


async def _parse(request: Request, model: type[B]) -> B:
    """The body as ``model``; every way it can be wrong is a 400 naming the key."""
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise invalid(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise invalid("the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise invalid(f"{where}: {first['msg']}", where or None) from None


async def _watch_disconnect(receive: Receive) -> None:
    """Returns when the client disconnects (the body has been read already)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """``work``'s result, or :class:`ClientGone` (``work`` cancelled) if the client leaves."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_watch_disconnect(receive))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ClientGone


class SSEResponse(Response):
    """Server-sent events from an async iterator, cancelled when the client disconnects.

    Starlette's StreamingResponse only notices a disconnect on its next write under
    ASGI 2.4 servers; a request queued in the model would then run on unnoticed.
    """

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        self.status_code = 200
        self.background = None
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),  # proxies: pass each event on at once
        ]
        self._events = events
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def body() -> None:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for data in self._events:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        try:
            await until_disconnected(receive, body())
        except (ClientGone, OSError):
            pass
        finally:
            self._on_close()


async def _collect(stream: TritonStream, output: ModelOutput) -> tuple[ModelOutput, str, Usage]:
    """Every response of the model merged into one: (whole output, finish reason, usage)."""
    whole = ModelOutput(logprobs=[], output_ids=[])
    usage = Usage()
    reason: str | None = None
    try:
        while True:
            usage.add(output)
            whole.text += output.text
            whole.logprobs = (whole.logprobs or []) + (output.logprobs or [])
            if output.output_ids is not None and whole.output_ids is not None:
                whole.output_ids += output.output_ids
            else:
                whole.output_ids = None
            reason = translate.finish_reason(output.finish_reason) or reason
            if output.final:
                break
            nxt = await anext(stream, None)
            if nxt is None:
                break
            output = nxt
    finally:
        stream.cancel()
    return whole, reason or "stop", usage


class OpenAIServer:
    """The routes' logic, bound to one Triton server."""

    def __init__(
        self,
        gateway: TritonGateway,
        default_max_tokens: int | None,
        carry: CarryOver | None = None,
    ) -> None:
        self.gateway = gateway
        self.default_max_tokens = default_max_tokens
        self.adapters = AdapterCatalogue(gateway)
        self.carry = carry or CarryOver(lambda model: gateway.model_ready(model))

    async def route(self, requested: str) -> tuple[str, str | None]:
        """The Triton model a body's ``model`` names, and the LoRA adapter if it names one.

        Adapters already known and models are found without a round trip (both are
        cached); a name neither has is looked for among the models' adapters again.
        """
        if (known := self.adapters.known(requested)) is not None:
            return known
        try:
            await self.gateway.spec(requested)
            return requested, None
        except OpenAIError as error:
            if error.status != 404 or (found := await self.adapters.resolve(requested)) is None:
                raise
            return found

    async def open(self, model: str, request: TritonRequest) -> tuple[TritonStream, ModelOutput]:
        """Start the Triton request and wait for its first response.

        A max_tokens this server chose (chat without one) that does not fit the model's
        context is lowered to what fits, once, as the model's error suggests.
        """
        while True:
            stream = self.gateway.stream(model, request)
            try:
                first = await anext(stream, None)
            except OpenAIError as error:
                if error.status == 400 and request.fit_max_tokens(error.message):
                    continue
                raise self.adapters.unloaded(error, model, request) from None
            except BaseException:
                stream.cancel()
                raise
            return stream, first or ModelOutput(final=True)

    async def open_carried(
        self, model: str, request: TritonRequest, clock: Clock, resends: int = 0
    ) -> tuple[TritonStream, ModelOutput]:
        """:meth:`open`, sent again over a Triton restart (carry_over.py); ``resends``
        > 0: this is already a resend (its deadline is what is left)."""

        async def attempt(count: int) -> tuple[TritonStream, ModelOutput]:
            self.carry.prepare_resend(request.sampling, model, clock, count)
            return await self.open(model, request)

        return await self.carry.run(model, clock, attempt, resends)

    async def complete(
        self, kind: str, body: ChatCompletionRequest | CompletionRequest, request: TritonRequest
    ) -> ChatCompletion | Completion:
        """A non-streamed answer: every response of the model merged into one object."""
        stream, output = await self.open(request.triton_model or body.model, request)
        ids = ResponseIds(body.model, "chatcmpl" if kind == "chat" else "cmpl")
        whole, reason, usage = await _collect(stream, output)
        top = request.top_logprobs
        if kind == "chat":
            chat_logprobs = None if top is None else translate.chat_logprobs(whole, top)
            content: str | None = whole.text
            calls: list[ToolCall] = []
            if request.tools is not None:
                content, calls = tools.parse(whole.text, request.tools)
                reason = request.tools.calls_finish_reason if calls else reason
            return translate.chat_completion(ids, content, reason, chat_logprobs, usage, calls)
        logprobs = None if top is None else translate.completion_logprobs(whole, len(request.echo))
        return translate.completion(ids, request.echo + whole.text, reason, logprobs, usage)

    async def complete_choices(
        self,
        kind: str,
        body: ChatCompletionRequest | CompletionRequest,
        request: TritonRequest,
    ) -> ChatCompletion | Completion:
        """A non-streamed answer of n > 1 choices: the model's responses carry one element
        per sequence; usage counts the prompt once and every sequence's tokens."""
        stream, output = await self.open(request.triton_model or body.model, request)
        ids = ResponseIds(body.model, "chatcmpl" if kind == "chat" else "cmpl")
        wholes: list[ModelOutput] = []
        reasons: list[str | None] = []
        usage = Usage()
        try:
            while True:
                usage.add(output)
                for i, choice in enumerate(output.choices or []):
                    if i == len(wholes):
                        wholes.append(ModelOutput(logprobs=[]))
                        reasons.append(None)
                    wholes[i].text += choice.text
                    wholes[i].logprobs = (wholes[i].logprobs or []) + (choice.logprobs or [])
                    reasons[i] = translate.finish_reason(choice.finish_reason) or reasons[i]
                if output.final:
                    break
                nxt = await anext(stream, None)
                if nxt is None:
                    break
                output = nxt
        finally:
            stream.cancel()
        top = request.top_logprobs
        if kind == "chat":
            chats = [
                ChatChoice(
                    index=i,
                    message=AssistantMessage(role="assistant", content=whole.text),
                    logprobs=None if top is None else translate.chat_logprobs(whole, top),
                    finish_reason=reasons[i] or "stop",
                )
                for i, whole in enumerate(wholes)
            ]
            return translate.chat_completion_of_choices(ids, chats, usage)
        echo = request.echo
        texts = [
            CompletionChoice(
                index=i,
                text=echo + whole.text,
                logprobs=None if top is None else translate.completion_logprobs(whole, len(echo)),
                finish_reason=reasons[i] or "stop",
            )
            for i, whole in enumerate(wholes)
        ]
        return translate.completion_of_choices(ids, texts, usage)

    async def next_or_resent(
        self,
        stream: TritonStream,
        requested: str,
        request: TritonRequest,
        clock: Clock,
        sent: Callable[[], int],
    ) -> tuple[TritonStream, ModelOutput | None, bool]:
        """The stream's next output. If Triton went down before the client got a character
        of the answer (``sent()`` characters went out; asked only then, off the per-token
        path), the request is sent again to its model (``requested`` unless the route named
        another) and this is the new stream's first output (True: usage counts anew)."""
        try:
            return stream, await anext(stream, None), False
        except TritonDown:
            if not carry_over.may_resend(sent()):
                raise
            stream.cancel()
            model = request.triton_model or requested
            stream, output = await self.open_carried(model, request, clock, 1)
            return stream, output, True

    async def choice_events(
        self,
        kind: str,
        body: ChatCompletionRequest | CompletionRequest,
        request: TritonRequest,
        stream: TritonStream,
        first: ModelOutput,
        clock: Clock,
    ) -> AsyncIterator[bytes]:
        """The SSE events of a streamed answer of n > 1 choices: each chunk carries one
        choice's delta under its ``index``, as OpenAI streams them."""
        chat = kind == "chat"
        ids = ResponseIds(body.model, "chatcmpl" if chat else "cmpl")
        with_usage = bool(body.stream_options and body.stream_options.include_usage)
        top = request.top_logprobs
        usage = Usage()
        opened: set[int] = set()
        offsets: dict[int, int] = {}
        output: ModelOutput | None = first
        try:
            while output is not None:
                usage.add(output)
                for i, choice in enumerate(output.choices or []):
                    if i not in opened:
                        opened.add(i)
                        if chat:
                            role = ChoiceDelta(role="assistant", content="")
                            yield _sse(translate.chat_chunk(ids, role, None, None, with_usage, i))
                    reason = translate.finish_reason(choice.finish_reason)
                    text = ("" if chat or i in offsets else request.echo) + choice.text
                    offset = offsets.setdefault(i, 0)
                    offsets[i] = offset + len(text)
                    if not (text or reason or choice.logprobs):
                        continue
                    chunk: ChatCompletionChunk | CompletionChunk
                    if chat:
                        logprobs = None if top is None else translate.chat_logprobs(choice, top)
                        delta = ChoiceDelta(content=text) if text or not reason else ChoiceDelta()
                        chunk = translate.chat_chunk(ids, delta, reason, logprobs, with_usage, i)
                    else:
                        at = offset + len(text) - len(choice.text)
                        logprobs_ = (
                            None if top is None else translate.completion_logprobs(choice, at)
                        )
                        chunk = translate.completion_chunk(
                            ids, text, reason, logprobs_, with_usage, i
                        )
                    yield _sse(chunk)
                if output.final:
                    break
                stream, output, resent = await self.next_or_resent(
                    stream, body.model, request, clock, lambda: sum(offsets.values())
                )
                if resent:
                    usage = Usage()
        except TritonDown:  # tokens went out: never replayed
            yield _sse(carry_over.stream_restarted(usage.completion_tokens or 0).body())
        except OpenAIError as error:  # mid-stream: the status line went out already
            yield _sse(error.body())
        finally:
            stream.cancel()
        if with_usage:
            yield _sse(translate.usage_chunk(ids, chat, usage))
        yield _DONE

    async def tool_events(
        self,
        body: ChatCompletionRequest,
        request: TritonRequest,
        plan: ToolPlan,
        stream: TritonStream,
        first: ModelOutput,
        clock: Clock,
    ) -> AsyncIterator[bytes]:
        """A streamed answer that may call tools: read whole (a call is only known once
        its tag closes), then sent as OpenAI streams calls, each chunk a typed one. Until
        then the client has only the role chunk: a Triton restart meanwhile resends it."""
        ids = ResponseIds(body.model, "chatcmpl")
        with_usage = bool(body.stream_options and body.stream_options.include_usage)
        role = ChoiceDelta(role="assistant", content="")
        yield _sse(translate.chat_chunk(ids, role, with_usage=with_usage))
        usage = Usage()
        try:
            while True:
                try:
                    whole, reason, usage = await _collect(stream, first)
                    break
                except TritonDown:
                    model = request.triton_model or body.model
                    stream, first = await self.open_carried(model, request, clock, 1)
            content, calls = tools.parse(whole.text, plan)
            if calls:
                chunks = translate.tool_call_chunks(
                    ids, content, calls, with_usage, plan.calls_finish_reason
                )
                for chunk in chunks:
                    yield _sse(chunk)
            else:
                if whole.text:
                    delta = ChoiceDelta(content=whole.text)
                    yield _sse(translate.chat_chunk(ids, delta, with_usage=with_usage))
                yield _sse(translate.chat_chunk(ids, ChoiceDelta(), reason, None, with_usage))
        except OpenAIError as error:  # mid-stream: the status line went out already
            yield _sse(error.body())
        if with_usage:
            yield _sse(translate.usage_chunk(ids, True, usage))
        yield _DONE

    async def events(
        self,
        kind: str,
        body: ChatCompletionRequest | CompletionRequest,
        request: TritonRequest,
        stream: TritonStream,
        first: ModelOutput,
        clock: Clock,
    ) -> AsyncIterator[bytes]:
        """The SSE events of a streamed answer, ending with ``data: [DONE]``.

        Triton lost before a character went out: the request is sent again and its
        answer streamed from its first token; after: the restart's error event."""
        chat = kind == "chat"
        ids = ResponseIds(body.model, "chatcmpl" if chat else "cmpl")
        with_usage = bool(body.stream_options and body.stream_options.include_usage)
        usage = Usage()
        offset = 0
        output: ModelOutput | None = first
        texts = TextChunks(ids, chat, with_usage)
        try:
            if chat:
                role = ChoiceDelta(role="assistant", content="")
                yield _sse(translate.chat_chunk(ids, role, with_usage=with_usage))
            prefix = request.echo
            while output is not None:
                usage.add(output)
                reason = translate.finish_reason(output.finish_reason)
                if output.final and reason is None:
                    reason = "stop"
                text = prefix + output.text
                prefix = ""
                if text and reason is None and request.top_logprobs is None:
                    offset += len(text)
                    yield texts.event(text)  # the common chunk, from its template
                elif text or reason or output.logprobs:
                    chunk: ChatCompletionChunk | CompletionChunk
                    if chat:
                        chat_logprobs = None
                        if request.top_logprobs is not None:
                            chat_logprobs = translate.chat_logprobs(output, request.top_logprobs)
                        delta = ChoiceDelta(content=text) if text or not reason else ChoiceDelta()
                        chunk = translate.chat_chunk(ids, delta, reason, chat_logprobs, with_usage)
                    else:
                        logprobs = None
                        if request.top_logprobs is not None:
                            logprobs = translate.completion_logprobs(
                                output, offset + len(text) - len(output.text)
                            )
                        chunk = translate.completion_chunk(ids, text, reason, logprobs, with_usage)
                    offset += len(text)
                    yield _sse(chunk)
                if output.final:
                    break
                stream, output, resent = await self.next_or_resent(
                    stream,
                    body.model,
                    request,
                    clock,
                    lambda: offset,  # noqa: B023 (asked within this await)
                )
                if resent:
                    usage = Usage()
        except TritonDown:  # tokens went out: never replayed
            yield _sse(carry_over.stream_restarted(usage.completion_tokens or 0).body())
        except OpenAIError as error:  # mid-stream: the status line went out already
            yield _sse(error.body())
        finally:
            stream.cancel()
        if with_usage:
            yield _sse(translate.usage_chunk(ids, chat, usage))
        yield _DONE

    async def parse(
        self, http: Request, kind: str
    ) -> tuple[ChatCompletionRequest | CompletionRequest, TritonRequest]:
        """The body, parsed, and its request to the model it names."""
        body: ChatCompletionRequest | CompletionRequest
        if kind == "chat":
            body = await _parse(http, ChatCompletionRequest)
        else:
            body = await _parse(http, CompletionRequest)
        model, adapter = await self.route(body.model)
        spec = await self.gateway.spec(model)
        if isinstance(body, ChatCompletionRequest):
            request = translate.chat_request(body, spec, self.default_max_tokens)
        else:
            request = translate.completion_request(body, spec)
        if adapter is not None:  # the model's lora_name: its adapter answers
            request.triton_model = model
            request.sampling["lora_name"] = adapter
        translate.apply_slo_headers(request, http.headers)
        return body, request

    async def embeddings(self, http: Request) -> Response:
        """``/v1/embeddings``: every input embedded by the model, one answer."""
        body = await _parse(http, EmbeddingRequest)
        items = embeddings.prompts(body)
        spec = await self.gateway.spec(body.model, "embedding")
        try:
            embedded = await until_disconnected(http.receive, self.gateway.embed(spec, items))
        except ClientGone:
            return Response(status_code=499)  # nobody reads it
        tokens = sum(count for _, count in embedded)
        vectors = [vector for vector, _ in embedded]
        return _json(
            embeddings.embedding_response(body.model, vectors, tokens, body.encoding_format)
        )

    async def generate(self, http: Request, kind: str) -> Response:
        arrived = time.monotonic()
        body, request = await self.parse(http, kind)
        clock = Clock(carry_over.timeout_of(request.sampling), arrived)
        model = request.triton_model or body.model
        several = (body.n or 1) > 1
        try:
            if not body.stream:
                answer_of = self.complete_choices if several else self.complete

                async def attempt(resends: int) -> ChatCompletion | Completion:
                    self.carry.prepare_resend(request.sampling, model, clock, resends)
                    return await answer_of(kind, body, request)

                work = self.carry.run(model, clock, attempt)
                answer = await until_disconnected(http.receive, work)
                return _json(answer)
            opening = self.open_carried(model, request, clock)
            stream, first = await until_disconnected(http.receive, opening)
        except ClientGone:
            return Response(status_code=499)  # nobody reads it; the request was cancelled
        events: AsyncIterator[bytes]
        if several:
            events = self.choice_events(kind, body, request, stream, first, clock)
        elif isinstance(body, ChatCompletionRequest) and request.tools is not None:
            events = self.tool_events(body, request, request.tools, stream, first, clock)
        else:
            events = self.events(kind, body, request, stream, first, clock)
        return SSEResponse(events, stream.cancel)


def _answer_errors_in_openai_shape(app: FastAPI) -> None:
    """Every error leaves as OpenAI's error body: ours, the framework's (404, 405) and a
    bug's (its type only, never request content)."""

    @app.exception_handler(OpenAIError)
    async def _openai_error(_request: Request, error: OpenAIError) -> Response:
        return error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, error: StarletteHTTPException) -> Response:
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        shaped = OpenAIError(error.status_code, str(error.detail), kind)
        return error_response(shaped)

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, error: Exception) -> Response:
        return error_response(internal(f"internal error ({type(error).__name__})"))


#: Prometheus' text exposition format, as Triton's metrics endpoint answers it.
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


async def scrape(url: str) -> bytes:
    """Triton's metrics page at ``url``; 503 while it does not answer."""
    try:
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as reply:
            if reply.status != 200:
                raise unavailable(f"Triton's metrics at {url} answered {reply.status}")
            return await reply.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise unreachable(url, type(exc).__name__) from None


def create_app(
    triton_grpc: str,
    default_max_tokens: int | None = DEFAULT_CHAT_MAX_TOKENS,
    gateway: TritonGateway | None = None,
    triton_metrics: str | None = None,
    carry_over_settings: CarryOverSettings | None = None,
) -> FastAPI:
    """The FastAPI app serving Triton at ``triton_grpc`` (HOST:PORT) the OpenAI way.

    ``gateway`` replaces the gRPC side (unit tests drive the routes with a fake one).
    ``triton_metrics`` is Triton's metrics URL, served again on ``/metrics``.
    ``carry_over_settings`` bound waiting for a restarted Triton (carry_over.py).
    """
    gateway = gateway or TritonGateway(triton_grpc)
    carry = CarryOver(lambda model: gateway.model_ready(model), carry_over_settings)
    server = OpenAIServer(gateway, default_max_tokens, carry)
    # Request ids and trace context (request_context.py); the tracer is None unless
    # tracing is configured.
    tracer = request_context.frontend_tracer()

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        freeze_startup_heap()  # no full GC pass walks start-up's objects again (heap.py)
        yield
        await gateway.close()
        if tracer is not None:
            tracer.shutdown()  # the last requests' spans leave too

    app = FastAPI(title="tritonforge OpenAI API", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = server
    app.add_middleware(
        request_context.RequestContextMiddleware,
        tracer=tracer,
        log_requests=log_requests_from_env(),
    )
    _answer_errors_in_openai_shape(app)
    _add_probe_routes(app, gateway, triton_metrics)
    _add_api_routes(app, server, gateway)
    return app


def _add_probe_routes(app: FastAPI, gateway: TritonGateway, triton_metrics: str | None) -> None:
    """Health probes and the metrics scrape: what a load balancer and Prometheus call."""

    async def ready_models() -> list[str]:
        """The models this frontend serves that are ready now; 503 while there are none.

        Per model, from Triton's repository index, not Triton's own ``/v2/health/ready``:
        Triton 2.51 answers that 400 for the whole server after any failed model load,
        while every loaded model keeps serving (docs/compatibility.md), and a load
        balancer would drop a healthy replica for it.
        """
        names = await gateway.served_models()  # 503 while Triton is not reachable
        if not names:
            raise unavailable(
                f"no model of Triton at {gateway.url} is ready to serve", TRITON_DOWN_RETRY_AFTER_S
            )
        return names

    @app.get("/health")
    async def health() -> Response:
        await ready_models()
        return JSONResponse({"status": "ok"})

    @app.get("/health/ready")
    async def health_ready() -> Response:
        """The readiness probe under Triton's OpenAI frontend's name, naming the models."""
        return JSONResponse({"status": "ok", "models": await ready_models()})

    @app.get("/metrics")
    async def metrics() -> Response:
        """Triton's Prometheus metrics (every model's families) on the API port, as vLLM's
        server serves its own: a scraper pointed at the API finds them."""
        if triton_metrics is None:
            raise unavailable("this frontend was started without --triton-metrics")
        return Response(await scrape(triton_metrics), media_type=PROMETHEUS_TEXT)


def _add_api_routes(app: FastAPI, server: OpenAIServer, gateway: TritonGateway) -> None:
    """The OpenAI API's routes (and vLLM's LoRA adapter routes beside them)."""

    @app.get("/v1/models")
    async def models() -> Response:
        names = await gateway.served_models()
        listing = translate.model_list(names, int(time.time()))
        listing.data += await server.adapters.cards(int(time.time()))
        return _json(listing)

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> Response:
        """One card of ``/v1/models`` (a model or a LoRA adapter), or 404 as OpenAI."""
        created = int(time.time())
        cards = translate.model_list(await gateway.served_models(), created).data
        cards += await server.adapters.cards(created)
        for card in cards:
            if card.id == model_id:
                return _json(card)
        raise model_not_found(model_id)

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        body = await _parse(request, LoadLoRAAdapterRequest)
        return Response(await server.adapters.load(body), status_code=200)

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        body = await _parse(request, UnloadLoRAAdapterRequest)
        return Response(await server.adapters.unload(body), status_code=200)

    @app.post("/v1/embeddings")
    async def create_embeddings(request: Request) -> Response:
        return await server.embeddings(request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await server.generate(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await server.generate(request, "completion")
