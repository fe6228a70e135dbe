"""The contract between the engine-agnostic core and one engine.

An adapter holds only what differs between engines: how to start and stop, how a
prompt becomes tokens (chat template, context limit), how :class:`SamplingParams` map
onto the engine's call, and how the engine's outputs become :class:`EngineOutput`
deltas. Everything else — parsing, streaming, cancellation, responses, metrics — is
the core's, so every engine answers the same request the same way.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Self, TypedDict, TypeVar

from tritonforge.engines.config import resolve_path, resolve_paths
from tritonforge.engines.lora import LORA_FILE, LoraAdapter, load_adapters
from tritonforge.serving.chat import ChatTemplate, Messages, Tools, plain_turns
from tritonforge.serving.errors import RequestError, engine_refusal
from tritonforge.serving.sampling import SAMPLING_KEYS, SamplingParams
from tritonforge.serving.schema import GenerateRequest

Handle = TypeVar("Handle")
Item = TypeVar("Item")

#: Takes one delta of a request; returns False once it wants no more.
OutputSink = Callable[["EngineOutput"], bool]


@dataclass(frozen=True)
class PreparedPrompt:
    """A prompt the engine accepted: its token ids and, when known, its text."""

    token_ids: tuple[int, ...]
    text: str | None = None


class TokenLogprob(TypedDict):
    """One candidate token at one output position, as clients receive it (vLLM's shape)."""

    logprob: float
    rank: int | None  # 1 is the most likely token; None where the engine does not say
    decoded_token: str | None


#: The candidates at one output position by token id: the sampled token and, when
#: asked for, the most likely others.
PositionLogprobs = dict[int, TokenLogprob]


@dataclass
class EngineOutput:
    """What one engine step added to a request (a delta, never cumulative).

    A request for ``n`` > 1 sequences gets deltas of each: ``index`` says which, and
    ``finished`` marks that sequence's last (the request ends with the last of the n).
    Past the engine, a response of such a request carries one output per sequence in
    ``choices`` (in index order), and its own other fields are unused.
    """

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] | None = None
    cumulative_logprob: float | None = None
    finished: bool = False
    finish_reason: str | None = None
    index: int = 0
    choices: list[EngineOutput] | None = None


@dataclass(frozen=True)
class EngineStats:
    """Scheduler state for the gauges; None where an engine cannot tell."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float | None = None
    #: LoRA adapters of requests that have produced a token / still wait for their first.
    running_loras: tuple[str, ...] = ()
    waiting_loras: tuple[str, ...] = ()
    #: Adapters one batch can hold (0: the model serves no adapters).
    max_lora: int = 0


#: The configuration key, read by the engine core for every engine, naming a model's own
#: Jinja chat template (a path like the engine's own, relative to the version directory).
CHAT_TEMPLATE_KEY = "chat_template"


@dataclass(frozen=True)
class ConfigFile:
    """Where an engine's settings live in a model's version directory."""

    name: str  # model.json, model.yaml
    #: Keys whose values are paths: ``$VAR`` expanded, relative to the version directory.
    path_keys: tuple[str, ...] = ()


class TokenLimits(abc.ABC):
    """What every request's tokens are checked against, for generate and embedding engines
    alike: the runtime refuses a prompt past these before the engine sees it."""

    @property
    @abc.abstractmethod
    def max_context(self) -> int:
        """Tokens of context the engine serves (the prompt, plus the output it generates)."""

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Token ids must lie below this."""


class StoredTokenLimits(TokenLimits):
    """Limits an engine reads from its model at ``start()`` into ``_max_context`` and
    ``_vocab_size`` (vLLM, TensorRT-LLM, the synthetic engine, vLLM embeddings)."""

    _max_context: int = 0
    _vocab_size: int = 0

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def vocab_size(self) -> int:
        return self._vocab_size


class Engine(TokenLimits):
    """One loaded model on one engine. All coroutines run on the runtime's loop."""

    #: Prefix of this engine's Prometheus metric names (``vllm:prompt_tokens_total``).
    metric_prefix: str = "llm"

    #: The engine's configuration file.
    config_file: ClassVar[ConfigFile]

    #: How often the runtime checks for cancelled clients (seconds).
    cancellation_poll_s: float = 0.1

    #: Why this engine cannot order its queue by ``priority`` (None: it can). A request
    #: asking for a priority the engine would silently ignore is refused with it.
    priority_unsupported: str | None = "this engine serves requests first come, first served"

    #: The exceptions by which the engine refuses a request as it takes it: the
    #: client's to fix, answered as an invalid argument naming the key they concern.
    refusals: ClassVar[tuple[type[Exception], ...]] = (ValueError,)

    #: Sequences one request may ask for (``n``). An engine that samples several
    #: sequences of one prompt together raises it; the others refuse n > 1, naming it.
    max_n: int = 1

    #: Sequences the engine decodes at once (None: no bound it can state). SLO admission
    #: predicts the wait for a free slot from it.
    max_running: int | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any], model_dir: Path) -> Self:
        """Build (not start) the engine from its configuration file's contents.

        Paths resolve here, the same way for every engine, so a model repository is
        portable between a clone and a container whatever the engine.
        """
        settings = resolve_paths(dict(config), model_dir, cls.config_file.path_keys)
        template = settings.pop(CHAT_TEMPLATE_KEY, None)
        engine = cls.from_settings(settings)
        if template is not None:
            engine.chat_template = ChatTemplate.load(Path(resolve_path(template, model_dir)))
        adapters = load_adapters(model_dir)
        if adapters:
            engine.serve_adapters(adapters)
        return engine

    @classmethod
    @abc.abstractmethod
    def from_settings(cls, settings: dict[str, Any]) -> Self:
        """Build the engine from its settings (paths resolved; the dict is the caller's copy)."""

    #: The LoRA adapters this model serves, by name (``multi_lora.json``).
    adapters: Mapping[str, LoraAdapter] = {}

    def serve_adapters(self, adapters: tuple[LoraAdapter, ...]) -> None:
        """Take the model's LoRA adapters (before ``start``); raise if they cannot be served.

        The default engine serves none: a ``multi_lora.json`` beside it is a mistake the
        load must report, not a file silently ignored.
        """
        raise ValueError(
            f"{LORA_FILE}: the {self.metric_prefix} engine does not serve LoRA adapters"
        )

    @property
    def loads_adapters(self) -> bool:
        """Whether :meth:`load_adapter` can add adapters to this model while it runs."""
        return False

    async def load_adapter(self, adapter: LoraAdapter) -> None:
        """Serve one more adapter from now on, on the running engine (no model reload).

        Called on the runtime's loop while requests run; it must leave them running. An
        adapter the engine cannot serve is a :class:`RequestError` naming ``lora_path``,
        and the engine keeps serving what it served. Engines replace :attr:`adapters`
        with a new mapping rather than changing it: Triton's thread reads it meanwhile.
        """
        raise RequestError(
            "lora_control",
            f"the {self.metric_prefix} engine does not load LoRA adapters at run time",
        )

    async def unload_adapter(self, name: str) -> None:
        """Stop serving adapter ``name`` (listed in :attr:`adapters`) to new requests.

        Requests already running with it finish with it.
        """
        raise RequestError(
            "lora_control",
            f"the {self.metric_prefix} engine does not unload LoRA adapters at run time",
        )

    @abc.abstractmethod
    async def start(self) -> None:
        """Load weights and get ready to serve; raise with a clear message on failure."""

    @abc.abstractmethod
    async def shutdown(self) -> None:
        """Stop the engine and every process it started."""

    @abc.abstractmethod
    def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        """The engine's own tokenizer; used for limits and token-level outputs."""

    #: The model's own chat template (``chat_template`` in its configuration file): it
    #: renders tool turns and ``tools`` itself. Without one, the tokenizer's template
    #: renders chats, tool turns flattened into plain turns first.
    chat_template: ChatTemplate | None = None

    @abc.abstractmethod
    def render_chat(self, messages: tuple[dict[str, str], ...]) -> str:
        """Render plain chat turns with the tokenizer's own template, generation prompt added."""

    def special_texts(self) -> dict[str, str]:
        """``bos_token``/``eos_token`` as text, for a configured ``chat_template``."""
        return {}

    def chat_prompt(self, messages: Messages, tools: Tools) -> str:
        """A chat as prompt text: the model's ``chat_template`` if it names one."""
        if self.chat_template is not None:
            return self.chat_template.render(messages, tools, self.special_texts())
        return self.render_chat(plain_turns(messages, tools))

    @abc.abstractmethod
    def generate(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingParams
    ) -> AsyncIterator[EngineOutput]:
        """Stream deltas for one request; the last one has ``finished`` set."""

    async def push(
        self,
        request_id: str,
        prompt: PreparedPrompt,
        sampling: SamplingParams,
        sink: OutputSink,
    ) -> None:
        """Hand one request's deltas to ``sink`` on the event loop, in order, until the
        last one or until ``sink`` returns False (the consumer wants no more).

        The runtime consumes every engine through this. Here it iterates
        :meth:`generate`; an engine that produces its deltas on the loop itself overrides
        it to call ``sink`` as each delta is made, so a streamed token costs no task
        wake-up (with hundreds of sequences a step, those wake-ups were the largest
        share of the event loop's time per token).
        """
        deltas = self.generate(request_id, prompt, sampling)
        try:
            async for delta in deltas:
                if not sink(delta):
                    return
        finally:  # a consumer done early: the engine's generator lets go of the request now
            if isinstance(deltas, AsyncGenerator):
                await deltas.aclose()

    @abc.abstractmethod
    async def abort(self, request_id: str) -> None:
        """Stop a request and free its engine resources (idempotent)."""

    def failure(self) -> str | None:
        """Why the engine can no longer serve (it died), or None while it can.

        The runtime's watchdog calls it every poll interval, requests or not, so it
        must be cheap and must not block; the default engine never dies.
        """
        return None

    def stats(self) -> EngineStats:
        """Current scheduler state; engines without one report zeros."""
        return EngineStats()

    def prepare(self, request: GenerateRequest) -> PreparedPrompt:
        """Turn the request's prompt into checked token ids (runs on Triton's thread)."""
        if request.prompt_ids is not None:
            ids = request.prompt_ids
            bad = next((t for t in ids if t >= self.vocab_size), None)
            if bad is not None:
                raise RequestError(
                    "input_ids",
                    f"token id {bad} is out of range (vocabulary size {self.vocab_size})",
                )
            prepared = PreparedPrompt(token_ids=tuple(ids))
            field_name = "input_ids"
        elif request.messages is not None:
            text = self.chat_prompt(request.messages, request.tools)
            prepared = PreparedPrompt(tuple(self.tokenize(text, add_special_tokens=False)), text)
            field_name = "messages"
        else:
            assert request.prompt is not None
            text = request.prompt
            prepared = PreparedPrompt(tuple(self.tokenize(text, add_special_tokens=True)), text)
            field_name = "text_input"
        self._check_adapter(request.sampling.lora_name)
        try:
            self.check_sampling(request.sampling)
        except RequestError:
            raise
        except self.refusals as exc:
            raise engine_refusal(exc, SAMPLING_KEYS) from None
        if request.sampling.n > self.max_n:
            raise RequestError(
                "sampling_parameters.n",
                f"the {self.metric_prefix} engine runs at most {self.max_n} sequence(s) per "
                f"request, got {request.sampling.n}; send n separate requests",
            )
        if request.sampling.priority != 0 and self.priority_unsupported is not None:
            raise RequestError(
                "sampling_parameters.priority",
                f"{self.priority_unsupported}; omit priority or send 0",
            )
        for i, token in enumerate(request.sampling.stop_token_ids):
            if token >= self.vocab_size:
                raise RequestError(
                    f"sampling_parameters.stop_token_ids[{i}]",
                    f"token id {token} is out of range (vocabulary size {self.vocab_size})",
                )
        # At least one token of room must remain for the output.
        prompt_tokens, context = len(prepared.token_ids), self.max_context
        if prompt_tokens >= context:
            raise RequestError(
                field_name,
                f"prompt is {prompt_tokens} tokens; the model's context is "
                f"{context} tokens and must leave room for at least one output token",
            )
        # The whole request must fit, as vLLM's own server requires: an engine would
        # otherwise stop at the context silently (finish_reason "length") or, in
        # llama.cpp's case, run past it. The rule is the same when max_tokens is the
        # default (16): a client near the limit learns it must ask for fewer.
        max_tokens = request.sampling.max_tokens
        if prompt_tokens + max_tokens > context:
            raise RequestError(
                "sampling_parameters.max_tokens",
                f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds the "
                f"model's context of {context} tokens; ask for at most "
                f"{context - prompt_tokens} tokens",
            )
        return prepared

    def check_sampling(self, sampling: SamplingParams) -> None:
        """Raise the engine's own error for settings it would refuse at submission.

        Called on Triton's thread before the request is handed over, so the engine's
        refusal is answered as an invalid argument naming the key (``prepare`` maps
        :attr:`refusals` so) rather than as a failure after the request was accepted. The
        shared table (sampling.py) already holds every engine to the tightest ranges;
        this catches what an engine checks beyond ranges. The default engine checks
        nothing more.
        """

    def _check_adapter(self, name: str | None) -> None:
        """Refuse an adapter name this model does not serve, listing the ones it does."""
        if name is None or name in self.adapters:
            return
        if not self.adapters:
            raise RequestError(
                "lora_name",
                f"this model serves no LoRA adapters (no {LORA_FILE}); omit lora_name",
            )
        raise RequestError(
            "lora_name",
            f"unknown LoRA adapter {name!r}; available: {', '.join(sorted(self.adapters))}",
        )


def adapter_unloaded(name: str) -> RequestError:
    """A request checked against an adapter that was unloaded before it reached the engine."""
    return RequestError("lora_name", f"LoRA adapter {name!r} was unloaded; send the request again")


class HFTokenizedEngine(StoredTokenLimits, Engine):
    """An engine that hands out a HuggingFace-style tokenizer (vLLM, TensorRT-LLM).

    Subclasses set ``_tokenizer``, ``_max_context`` and ``_vocab_size`` in ``start()``;
    tokenizing and chat rendering are then the same for both.
    """

    _tokenizer: Any = None

    def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def special_texts(self) -> dict[str, str]:
        named = {"bos_token": self._tokenizer.bos_token, "eos_token": self._tokenizer.eos_token}
        return {k: v for k, v in named.items() if isinstance(v, str)}

    def render_chat(self, messages: tuple[dict[str, str], ...]) -> str:
        prompt: str = self._tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=True
        )
        return prompt


async def stop_on_thread(handle: Handle | None, stop: Callable[[Handle], object]) -> None:
    """Run an engine's blocking stop call on a worker thread (nothing if never started).

    Stopping an engine joins its processes or threads; on the runtime's loop that would
    stall every coroutine still winding down.
    """
    if handle is not None:
        await asyncio.to_thread(stop, handle)


class Mailbox(Generic[Item]):
    """One request's outputs from its engine to its consumer, on the event loop.

    What ``asyncio.Queue`` does for this one producer and one consumer, at a fraction of
    its cost per item (no size bound, task counting or waiter list): a streamed token
    passes through here once per step for every running sequence. A consumer either
    awaits each item (:meth:`get`) or has every item handed to a function as it is put
    (:meth:`drain`), which spares the task wake-up per item.
    """

    __slots__ = ("_drained", "_items", "_sink", "_waiter")

    def __init__(self) -> None:
        self._items: collections.deque[Item] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._sink: Callable[[Item], bool] | None = None
        self._drained: asyncio.Future[None] | None = None

    def put(self, item: Item) -> None:
        if self._sink is not None:
            self._hand(self._sink, item)
            return
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def get(self) -> Item:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self._items.popleft()

    async def drain(self, sink: Callable[[Item], bool]) -> None:
        """Call ``sink`` with every item, those waiting first, then each as it is put,
        until ``sink`` returns False; what ``sink`` raises is raised here.

        The producer's ``put`` runs ``sink``, so a failing consumer never breaks the
        producer (an engine step serving other requests): the error ends this wait only.
        """
        self._drained = drained = asyncio.get_running_loop().create_future()
        while self._items and not drained.done():
            self._hand(sink, self._items.popleft())
        if not drained.done():
            self._sink = sink
        try:
            await drained
        finally:
            self._sink = self._drained = None

    def _hand(self, sink: Callable[[Item], bool], item: Item) -> None:
        drained = self._drained
        assert drained is not None
        try:
            more = sink(item)
        except Exception as exc:  # the consumer's error, raised in drain()
            more = False
            if not drained.done():
                drained.set_exception(exc)
        if not more:
            self._sink = None
            if not drained.done():
                drained.set_result(None)


class _Sequences:
    """How many of a request's n sequences are still to end: its outputs stop after the
    last one's final delta, or at once when the request was aborted."""

    __slots__ = ("_left",)

    def __init__(self, n: int) -> None:
        self._left = n

    def ended_by(self, item: EngineOutput) -> bool:
        if item.finished:
            self._left = 0 if item.finish_reason == "abort" else self._left - 1
        return self._left <= 0


class MailboxStreams(Engine, Generic[Handle]):
    """:meth:`Engine.generate` and :meth:`Engine.push` for an engine whose outputs reach
    each request through a :class:`Mailbox` on the event loop (deltas, or an exception
    that ends the request); listed before another Engine base when there is one.

    The engine says how a request is queued (``_submit``: its handle and mailbox) and
    where handles are tracked (``_tracker``); a request is tracked for as long as its
    consumer reads, however that ends.
    """

    @abc.abstractmethod
    def _submit(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingParams
    ) -> tuple[Handle, Mailbox[EngineOutput | BaseException]]:
        """Queue the request; its handle and the mailbox its outputs arrive in."""

    @abc.abstractmethod
    def _tracker(self) -> RequestTracker[Handle]:
        """Where the engine keeps the handles of the requests being generated."""

    async def generate(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingParams
    ) -> AsyncIterator[EngineOutput]:
        handle, outputs = self._submit(request_id, prompt, sampling)
        left = _Sequences(sampling.n)
        with self._tracker().track(request_id, handle):
            while True:
                item = await outputs.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if left.ended_by(item):
                    return

    async def push(
        self,
        request_id: str,
        prompt: PreparedPrompt,
        sampling: SamplingParams,
        sink: OutputSink,
    ) -> None:
        """Each delta goes to ``sink`` from the mailbox as it is put (see Engine.push)."""

        left = _Sequences(sampling.n)

        def take(item: EngineOutput | BaseException) -> bool:
            if isinstance(item, BaseException):
                raise item
            return sink(item) and not left.ended_by(item)

        handle, outputs = self._submit(request_id, prompt, sampling)
        with self._tracker().track(request_id, handle):
            await outputs.drain(take)


class RequestTracker(Generic[Handle]):
    """The engine's handle of every request being generated, by request id.

    :meth:`track` registers a request for as long as its generator runs and releases it
    however the generator ends (finished, failed, or its consumer gone), so a request
    nobody reads any more never keeps holding the engine.
    """

    def __init__(self, release: Callable[[Handle], object]) -> None:
        self._release = release
        self._handles: dict[str, Handle] = {}

    @contextlib.contextmanager
    def track(self, request_id: str, handle: Handle) -> Iterator[Handle]:
        self._handles[request_id] = handle
        try:
            yield handle
        finally:
            self._handles.pop(request_id, None)
            self._release(handle)

    def get(self, request_id: str) -> Handle | None:
        return self._handles.get(request_id)

    def handles(self) -> list[Handle]:
        """A snapshot: requests may end while the caller goes through it."""
        return list(self._handles.values())

    def __len__(self) -> int:
        return len(self._handles)
