"""llama.cpp adapter (llama-cpp-python): the only module that imports llama_cpp.

The engine serves a GGUF file through one llama.cpp context. ``model.json`` holds
``llama_cpp.Llama`` keyword arguments (as vLLM's holds ``AsyncEngineArgs``) plus keys
this adapter owns, which ``Llama()`` would silently ignore: ``n_parallel``, the number
of sequences decoded together (llama-server's slots), ``kv_unified`` and
``batch_invariant`` (below).
``n_ctx`` is each sequence's context: every slot keeps the model's full context.

Continuous batching: the ``Llama`` object loads the model, tokenizer and chat template;
the serving context is this adapter's own, built from ``Llama``'s parameters with
``n_seq_max`` = ``n_parallel`` (plus one with ``batch_invariant``) and ``n_ctx`` = ``n_seq_max`` x
context. Its KV cache is split per sequence (``kv_unified`` false by default): a unified
one evaluated prompts slower in every round measured (perf/results/llamacpp-step).

Whether a sequence's logits are bit-for-bit the same alone and beside others depends on
the weights. llama.cpp evaluates a call in runs of consecutive sequences; with float
weights (the shipped bfloat16 GGUF) a run of one is a dot product per row and a longer
run a tiled GEMM, which sums in another order, so a greedy answer can change at a
near-tie with which slots decode beside it, as in llama-server; a sequence alone gives
llama.cpp's own single-sequence answer. ``batch_invariant`` (false by default) pads
every run of one to two rows, so answers do not depend on the neighbours, at a cost:
one request alone streamed about half the tokens/s through Triton
(perf/results/llamacpp/20261204T162820Z). Quantised weights without a GEMM kernel (Q4_1)
are invariant either way. ``flash_attn`` must stay on for invariance too: llama.cpp's
other attention kernel sums over masked cells too, so an answer would
depend on which cells of its slot a sequence landed in after earlier requests (a seeded
request sent twice gave two texts). One worker thread owns the
context (its calls block); every step it lets waiting requests into free slots,
evaluates one prompt block (a call of its own), and decodes one token for every
generating sequence in a single ``llama_decode`` call. The event loop only moves
deltas. A request that finishes or is cancelled leaves between steps; its generated
tokens' KV cells are freed at once and its prompt's cells stay as that slot's prompt
cache (see :mod:`.llamacpp_slots` for slot
choice, prefix reuse by whole blocks and why, and how LoRA adapters take turns).

LoRA adapters are GGUF files loaded beside the model (``llama_adapter_lora_init``), at
start from ``multi_lora.json`` and at run time by :meth:`LlamaCppEngine.load_adapter`,
whose load runs on the worker thread between two steps (the worker owns every
llama.cpp call). Slots and the context know an adapter by its name and id, so weights
loaded again under a name never reuse a prompt cache computed with the old ones. An
unloaded adapter's weights stay in memory until the model unloads: a request already
waiting may still run with them, and llama.cpp frees every adapter with its model.

Requests beyond the slots wait in priority order (``priority``, lower first), first come
first served within a priority. The wait is bounded by the
runtime's ``max_inflight`` (slots plus queue, in config.pbtxt): past it a request gets
the "busy" error at once rather than a wait of unknown length. A request aborted while
waiting never reaches the context.

A request for ``n`` > 1 sequences (at most ``n_parallel``) waits until n slots are free
at once; its prompt is evaluated in one of them, its KV copied into the others
(``llama_memory_seq_cp``), and each sequence samples its first token from the same
logits, then decodes on its own (seeded ones take seed, seed + 1, …, as vLLM's do).

Sampling is per sequence: each has its own llama.cpp sampler chain (penalties, grammar,
top-k/top-p/min-p, temperature, a seeded distribution), in ``Llama``'s own order.
llama.cpp hands back token ids; bytes become text through the core's
:class:`~tritonforge.engines.text_stream.TextStream` (UTF-8 safe, stop strings held
back), so streamed and non-streamed answers are the same text.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, cast

import llama_cpp
import numpy as np
import numpy.typing as npt
from llama_cpp.llama_chat_format import Jinja2ChatFormatter
from llama_cpp.llama_types import ChatCompletionRequestMessage

from tritonforge.engines.base import (
    ConfigFile,
    EngineOutput,
    EngineStats,
    Mailbox,
    MailboxStreams,
    PositionLogprobs,
    PreparedPrompt,
    RequestTracker,
    TokenLogprob,
    adapter_unloaded,
    stop_on_thread,
)
from tritonforge.engines.gbnf import checked_grammar
from tritonforge.engines.llamacpp_slots import (
    PROMPT_BLOCK,
    Slot,
    choose_slot,
    may_join,
    spare_slots,
)
from tritonforge.engines.lora import GGUF_ADAPTER_FILE, LORA_FILE, LoraAdapter
from tritonforge.engines.text_stream import TextStream, TokenDecoding
from tritonforge.serving.errors import RequestError
from tritonforge.serving.sampling import SamplingParams

#: model.json keys this adapter reads itself; the rest are ``Llama()`` keyword arguments.
ADAPTER_KEYS = frozenset({"n_parallel", "kv_unified", "batch_invariant"})
#: GGUF file types whose matrices llama.cpp multiplies with a dot product for one row and
#: a tiled GEMM (llamafile's tinyBLAS) for two or more: the two sum in different orders.
FLOAT_FILE_TYPES = frozenset({0, 1, 32})  # all F32, mostly F16, mostly BF16

# --- the model's vocabulary, read once ------------------------------------------


@dataclass(frozen=True)
class _Vocabulary:
    """Every token's bytes and end-of-generation flag, read when the model loads.

    llama.cpp answers these through one ctypes call per token; tables read once keep
    the per-token path of a request to list and array lookups.
    """

    plain: list[bytes]  # special tokens render as nothing (skip_special_tokens)
    with_special: list[bytes]  # special tokens render as their text
    ends_generation: npt.NDArray[np.bool_]  # bool per token id: EOS, EOT and the like

    @classmethod
    def read(cls, llama: Any) -> _Vocabulary:
        vocab, tokens = llama._model.vocab, range(llama.n_vocab())
        return cls(
            plain=[_piece(vocab, t, special=False) for t in tokens],
            with_special=[_piece(vocab, t, special=True) for t in tokens],
            ends_generation=np.array(
                [llama_cpp.llama_token_is_eog(vocab, t) for t in tokens], dtype=bool
            ),
        )

    def pieces(self, skip_special_tokens: bool) -> list[bytes]:
        return self.plain if skip_special_tokens else self.with_special

    def text(self, token: int) -> str:
        """A token's text as clients see it in logprobs and chat templates."""
        return self.with_special[token].decode("utf-8", "replace")


def _piece(vocab: Any, token: int, special: bool) -> bytes:
    size = 64
    while True:
        buffer = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_token_to_piece(vocab, token, buffer, size, 0, special)
        if n >= 0:
            return buffer.raw[:n]
        size = -n


# --- one request, waiting or running ----------------------------------------------


class _JobState(Enum):
    QUEUED = "queued"
    RUNNING = "running"  # the worker gave it a slot
    DROPPED = "dropped"  # aborted before it got a slot: it never runs


@dataclass(frozen=True)
class _Adapter:
    """A loaded llama.cpp adapter and the key slots and the context know it by."""

    pointer: Any  # llama_adapter_lora pointer
    key: str  # name and id: unique for the model's life, unlike a name loaded twice


@dataclass
class _Call:
    """Work for the worker thread between two steps, and where its result goes."""

    run: Callable[[], Any]
    done: Callable[[Any], object]  # the result, or the exception it raised


@dataclass
class _Job:
    request_id: str
    prompt: list[int]
    sampling: SamplingParams
    grammar: str | None  # GBNF, already checked against the vocabulary
    deliver: Callable[[EngineOutput | BaseException], object]
    lora: _Adapter | None = None  # the adapter to run with (None: the base model)
    cancel: threading.Event = field(default_factory=threading.Event)
    state: _JobState = _JobState.QUEUED
    lock: threading.Lock = field(default_factory=threading.Lock)

    def leave_queue(self, state: _JobState) -> bool:
        """Move a queued job to ``state``; False if it already left the queue.

        The worker (starting the job) and an abort (dropping it) race for a queued job;
        the lock makes exactly one of them win.
        """
        with self.lock:
            if self.state is not _JobState.QUEUED:
                return False
            self.state = state
            return True


ABORTED = EngineOutput(finished=True, finish_reason="abort")


def _sampler_chain(
    params: SamplingParams, grammar: str | None, vocab: Any, last_n: int
) -> Any | None:
    """A llama.cpp sampler chain for one sequence, in ``Llama``'s own order; None when
    the chain would only take the argmax.

    ``llama_sampler_sample`` accepts each sampled token into the chain, so penalties
    see the generation and the grammar advances with it. It also builds a candidate
    array of the whole vocabulary first, on the worker thread between two steps, so
    plain greedy decoding takes the argmax of the logits row itself: the same token,
    llama.cpp's greedy sampler also keeping the first maximum.
    """
    penalties = (params.repetition_penalty, params.frequency_penalty, params.presence_penalty)
    if params.temperature == 0 and penalties == (1.0, 0.0, 0.0) and grammar is None:
        return None
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())

    def add(sampler: Any) -> None:
        llama_cpp.llama_sampler_chain_add(chain, sampler)

    if penalties != (1.0, 0.0, 0.0):
        add(llama_cpp.llama_sampler_init_penalties(last_n, *penalties))
    if grammar is not None:
        add(llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode("utf-8"), b"root"))
    if params.temperature == 0:
        add(llama_cpp.llama_sampler_init_greedy())
        return chain
    add(llama_cpp.llama_sampler_init_top_k(max(params.top_k, 0)))
    add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
    add(llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
    add(llama_cpp.llama_sampler_init_temp(params.temperature))
    # llama.cpp seeds are 32-bit and 0xFFFFFFFF means "random": fold into range.
    add(llama_cpp.llama_sampler_init_dist(params.seed_or_random() % 0xFFFFFFFF))
    return chain


@dataclass
class _Sequence:
    """A job in a slot: its prompt's progress, its sampler and the token to feed next."""

    job: _Job
    slot: Slot
    decoding: TokenDecoding
    sampler: Any | None  # llama.cpp sampler chain, freed when the sequence leaves; None: argmax
    evaluated: int  # prompt tokens whose KV the slot holds
    token: int | None = None  # sampled, not yet evaluated
    position: int = 0  # the position ``token`` goes to
    index: int = 0  # which of the request's n sequences
    #: The request's other sequences (n > 1): they wait for this one's prompt, whose KV
    #: is then copied into their slots, and sample their first token from its logits.
    siblings: list[_Sequence] = field(default_factory=list)
    waits: bool = False  # a sibling: its prompt comes from another sequence's slot

    @property
    def prefilling(self) -> bool:
        return self.evaluated < len(self.job.prompt)


# --- the serving context ----------------------------------------------------------


class _Context:
    """The llama.cpp context the worker owns: one batch, decode calls, logits, KV edits.

    With one KV stream per sequence (``kv_unified`` false) llama.cpp evaluates a call in
    runs of consecutive sequence ids, one pass over the weights per run, so a step's
    tokens go in sequence order (:meth:`step`). ``pad_lone_steps``: a run of one
    sequence gets a throw-away row in the next stream (appended after that stream's last
    cell and removed after the call; the stream past the last slot exists for this).
    With float weights llama.cpp multiplies one row with a dot product and two or more
    with a tiled GEMM, which sums in another order, so without the pad a greedy answer
    could change with which slots ran beside it.
    """

    def __init__(
        self,
        llama: Any,
        settings: dict[str, Any],
        slots: int,
        context: int,
        pad_lone_steps: bool,
    ) -> None:
        params = llama_cpp.llama_context_params.from_buffer_copy(llama.context_params)
        self.capacity = max(int(settings.get("n_batch", 512)), 2 * slots, PROMPT_BLOCK)
        self.pad_lone_steps = pad_lone_steps
        streams = slots + 1 if pad_lone_steps else slots
        params.n_ctx = streams * context
        params.n_batch = self.capacity
        params.n_ubatch = min(int(settings.get("n_ubatch", 512)), self.capacity)
        params.n_seq_max = streams
        params.kv_unified = bool(settings.get("kv_unified", False))
        self.threads = (int(params.n_threads), int(params.n_threads_batch))
        self.n_vocab = llama.n_vocab()
        self.ctx = llama_cpp.llama_init_from_model(llama._model.model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context for n_parallel sequences")
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(self.capacity, 0, 1)

    def decode(self, items: list[tuple[int, int, int, bool]]) -> None:
        """Evaluate ``(token, position, seq_id, wants_logits)`` items in one call."""
        batch = self.batch
        batch.n_tokens = len(items)
        for i, (token, position, seq_id, wants_logits) in enumerate(items):
            batch.token[i], batch.pos[i] = token, position
            batch.n_seq_id[i], batch.seq_id[i][0] = 1, seq_id
            batch.logits[i] = wants_logits
        status = llama_cpp.llama_decode(self.ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed (status {status})")

    def step(self, items: list[tuple[int, int, int]]) -> list[int]:
        """Decode ``(token, position, seq_id)``, one per generating sequence, in one call;
        returns each item's output index for :meth:`logits`."""
        ids = {seq_id for _, _, seq_id in items}
        rows: list[tuple[int, int, int, bool]] = []
        pads: list[tuple[int, int]] = []
        index = [0] * len(items)
        for i in sorted(range(len(items)), key=lambda i: items[i][2]):
            token, position, seq_id = items[i]
            index[i] = len(rows)
            rows.append((token, position, seq_id, True))
            if self.pad_lone_steps and seq_id - 1 not in ids and seq_id + 1 not in ids:
                start = llama_cpp.llama_memory_seq_pos_max(self.memory, seq_id + 1) + 1
                # logits too: the output matrix is then multiplied as in any run of two
                rows.append((token, start, seq_id + 1, True))
                pads.append((seq_id + 1, start))
        # one padded sequence keeps n_threads, as llama.cpp gives it unpadded
        padded_alone = len(items) == 1 and bool(pads)
        if padded_alone:
            llama_cpp.llama_set_n_threads(self.ctx, self.threads[0], self.threads[0])
        try:
            self.decode(rows)
        finally:
            if padded_alone:
                llama_cpp.llama_set_n_threads(self.ctx, *self.threads)
            for seq_id, start in pads:
                self.forget(seq_id, start)
        return index

    def logits(self, index: int) -> npt.NDArray[np.float32]:
        """The logits of output ``index`` of the last call, as a view (valid until the next)."""
        pointer = llama_cpp.llama_get_logits_ith(self.ctx, index)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))

    def copy(self, source: int, target: int) -> None:
        """Give sequence ``target`` the KV cells of ``source`` (its prompt, evaluated once)."""
        llama_cpp.llama_memory_seq_cp(self.memory, source, target, 0, -1)

    def forget(self, seq_id: int, start: int) -> None:
        """Free the sequence's KV cells from position ``start`` on."""
        llama_cpp.llama_memory_seq_rm(self.memory, seq_id, start, -1)

    def use_adapter(self, lora: Any) -> None:
        """Put an adapter (None: none) on the context; the last one must go."""
        llama_cpp.llama_clear_adapter_lora(self.ctx)
        if lora is not None and llama_cpp.llama_set_adapter_lora(self.ctx, lora, 1.0) != 0:
            raise RuntimeError("llama.cpp could not apply the request's LoRA adapter")

    def close(self) -> None:
        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ctx)


# --- the engine -----------------------------------------------------------------------


class LlamaCppEngine(MailboxStreams[_Job]):
    metric_prefix = "llamacpp"
    config_file = ConfigFile("model.json", path_keys=("model_path",))
    priority_unsupported = None  # the waiting line is kept in priority order (_enqueue)

    def __init__(self, settings: dict[str, Any]) -> None:
        self._settings = settings
        self._kwargs = {k: v for k, v in settings.items() if k not in ADAPTER_KEYS}
        self._n_parallel = int(settings.get("n_parallel", 1))
        self._context_tokens = int(settings.get("n_ctx", 512))
        self._last_n = int(settings.get("last_n_tokens_size", self._context_tokens))
        self._llama: Any = None
        self._ctx: _Context | None = None
        self._formatter: Jinja2ChatFormatter | None = None
        self._vocab = _Vocabulary([], [], np.zeros(0, dtype=bool))
        self._inbox: queue.SimpleQueue[_Job | _Call | None] = queue.SimpleQueue()
        self._waiting: deque[_Job] = deque()  # the worker's, by priority then arrival
        self._running: list[_Sequence] = []  # the worker's, in admission order
        self._slots = [Slot(seq_id) for seq_id in range(self._n_parallel)]
        # n sequences of one request run in n slots, sharing its prompt's evaluation.
        self.max_n = self.max_running = self._n_parallel
        self._tick = 0
        self._on_context: str | None = None  # the key of the adapter set on the context
        self._worker: threading.Thread | None = None
        self._stopping = False
        self._jobs: RequestTracker[_Job] = RequestTracker(release=self._drop)
        self._queued = 0
        self._counts = threading.Lock()
        self._lora_files: dict[str, Path] = {}
        self._loras: dict[str, _Adapter] = {}  # by name, after start (replaced, not changed)

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> LlamaCppEngine:
        if not settings.get("model_path"):
            raise ValueError("model.json: model_path (a GGUF file) is required")
        if not Path(settings["model_path"]).is_file():
            raise FileNotFoundError(
                f"model.json: model_path {settings['model_path']} is not a file"
            )
        parallel = settings.setdefault("n_parallel", 1)
        if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
            raise ValueError(
                f"model.json: n_parallel must be a whole number >= 1, got {parallel!r}"
            )
        for key, default in (("kv_unified", False), ("batch_invariant", False)):
            if not isinstance(settings.get(key, default), bool):
                raise ValueError(f"model.json: {key} must be true or false")
        # The serving context reads logits per output row; Llama's own would cost
        # n_ctx x n_vocab floats.
        settings["logits_all"] = False
        settings.setdefault("verbose", False)
        settings.setdefault("flash_attn", True)  # see the module docstring
        # Penalties should see the whole generation, as vLLM's do, not the last 64 tokens.
        settings.setdefault("last_n_tokens_size", settings.get("n_ctx", 512))
        return cls(settings)

    def serve_adapters(self, adapters: tuple[LoraAdapter, ...]) -> None:
        """Check every adapter has its GGUF file now; they load with the model."""
        for adapter in adapters:
            path = adapter.path / GGUF_ADAPTER_FILE
            if not path.is_file():
                raise FileNotFoundError(
                    f"{LORA_FILE}: adapter {adapter.name!r}: llama.cpp needs {path} (a GGUF "
                    "LoRA; tritonforge.launch.lora_store.write_gguf converts a PEFT adapter)"
                )
            self._lora_files[adapter.name] = path
        self.adapters = {adapter.name: adapter for adapter in adapters}

    # --- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        await asyncio.to_thread(self._load)
        self._worker = threading.Thread(target=self._work, name="llamacpp-worker", daemon=True)
        self._worker.start()

    def _load(self) -> None:
        # Llama loads the model, tokenizer and template; its own context (one sequence,
        # a small batch: its logits buffer is n_batch x n_vocab floats) is freed at once
        # for the serving context built from the same parameters.
        self._llama = llama = llama_cpp.Llama(**{**self._kwargs, "n_batch": 8})
        llama._ctx.close()
        for name, path in self._lora_files.items():
            pointer = llama_cpp.llama_adapter_lora_init(llama._model.model, str(path).encode())
            if not pointer:
                raise RuntimeError(f"{LORA_FILE}: llama.cpp could not load adapter {name!r}")
            self._loras[name] = _Adapter(pointer, f"{name}#{self.adapters[name].int_id}")
        self._vocab = _Vocabulary.read(llama)
        template = llama.metadata.get("tokenizer.chat_template")
        if template:
            self._formatter = Jinja2ChatFormatter(
                template,
                eos_token=self._special_text(llama.token_eos()),
                bos_token=self._special_text(llama.token_bos()),
            )
        file_type = int(llama.metadata.get("general.file_type", -1))
        pad = bool(self._settings.get("batch_invariant", False)) and file_type in FLOAT_FILE_TYPES
        self._ctx = _Context(llama, self._settings, self._n_parallel, self._context_tokens, pad)

    async def shutdown(self) -> None:
        self._stopping = True
        for job in self._jobs.handles():
            job.cancel.set()
        self._inbox.put(None)
        await stop_on_thread(self._worker, threading.Thread.join)
        if self._ctx is not None:
            context, self._ctx = self._ctx, None
            context.close()
        # Adapters belong to the model: llama.cpp frees them with it (freeing them here
        # as well would free them twice).
        self._loras.clear()
        if self._llama is not None:
            llama, self._llama = self._llama, None
            llama.close()

    @property
    def loads_adapters(self) -> bool:
        return True

    async def load_adapter(self, adapter: LoraAdapter) -> None:
        """Load the adapter's GGUF beside the model, on the worker thread between steps."""
        path = adapter.path / GGUF_ADAPTER_FILE
        if not path.is_file():
            raise RequestError(
                "lora_path",
                f"llama.cpp needs {path} (a GGUF LoRA; tritonforge.launch.lora_store.write_gguf "
                "converts a PEFT adapter)",
            )
        model = self._llama._model.model
        pointer = await self._on_worker(
            lambda: llama_cpp.llama_adapter_lora_init(model, str(path).encode())
        )
        if not pointer:
            raise RequestError(
                "lora_path",
                f"llama.cpp could not load {path} (not a LoRA for this model; see the server log)",
            )
        loaded = _Adapter(pointer, f"{adapter.name}#{adapter.int_id}")
        self._loras = {**self._loras, adapter.name: loaded}
        self.adapters = {**self.adapters, adapter.name: adapter}

    async def unload_adapter(self, name: str) -> None:
        # Its weights stay loaded (module docstring): queued jobs may still hold them.
        self.adapters = {k: v for k, v in self.adapters.items() if k != name}
        self._loras = {k: v for k, v in self._loras.items() if k != name}

    async def _on_worker(self, run: Callable[[], Any]) -> Any:
        """``run()``'s result, called on the worker thread between two steps."""
        if self._worker is None or not self._worker.is_alive() or self._stopping:
            raise RuntimeError("the llama.cpp worker is not running")
        loop = asyncio.get_running_loop()
        result: asyncio.Future[Any] = loop.create_future()

        def settle(value: Any) -> None:
            if isinstance(value, BaseException):
                result.set_exception(value)
            else:
                result.set_result(value)

        self._inbox.put(_Call(run, lambda value: loop.call_soon_threadsafe(settle, value)))
        return await result

    def failure(self) -> str | None:
        # One worker thread runs every sequence; a job's own error never ends it, so
        # a worker that is gone without a shutdown took the engine with it.
        worker = self._worker
        if worker is not None and not worker.is_alive() and not self._stopping:
            return "the llama.cpp worker thread exited"
        return None

    def _special_text(self, token: int) -> str:
        """A special token's text for the chat template ("" where the model has none)."""
        return self._vocab.text(token) if token >= 0 else ""

    # --- the model -----------------------------------------------------------------

    @property
    def max_context(self) -> int:
        return self._context_tokens

    @property
    def vocab_size(self) -> int:
        size: int = self._llama.n_vocab()
        return size

    def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        # add_bos asks for the model's own special tokens (BOS only if its vocab says so);
        # special=True parses special-token text, as HF tokenizers do.
        ids: list[int] = self._llama.tokenize(
            text.encode("utf-8"), add_bos=add_special_tokens, special=True
        )
        return ids

    def special_texts(self) -> dict[str, str]:
        assert self._llama is not None, "engine not started"
        return {
            "bos_token": self._special_text(self._llama.token_bos()),
            "eos_token": self._special_text(self._llama.token_eos()),
        }

    def render_chat(self, messages: tuple[dict[str, str], ...]) -> str:
        if self._formatter is None:
            raise RequestError("messages", "this GGUF has no chat template; send text_input")
        try:
            # The schema checked each message's role and content: llama_cpp's message shape.
            chat = cast(list[ChatCompletionRequestMessage], [dict(m) for m in messages])
            return self._formatter(messages=chat).prompt
        except ValueError as exc:  # the template's raise_exception()
            raise RequestError("messages", f"rejected by the chat template: {exc}") from None

    # --- requests ------------------------------------------------------------------

    def _tracker(self) -> RequestTracker[_Job]:
        return self._jobs

    def _submit(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingParams
    ) -> tuple[_Job, Mailbox[EngineOutput | BaseException]]:
        """Queue the request for the worker; its outputs arrive in the mailbox."""
        assert self._llama is not None, "engine not started"
        loop = asyncio.get_running_loop()
        outputs: Mailbox[EngineOutput | BaseException] = Mailbox()
        spec = sampling.structured_outputs
        lora = None if sampling.lora_name is None else self._loras.get(sampling.lora_name)
        if sampling.lora_name is not None and lora is None:
            raise adapter_unloaded(sampling.lora_name)
        job = _Job(
            request_id,
            list(prompt.token_ids),
            sampling,
            None if spec is None else checked_grammar(spec, self._llama._model.vocab),
            lambda item: loop.call_soon_threadsafe(outputs.put, item),
            lora,
        )
        with self._counts:
            self._queued += 1
        self._inbox.put(job)
        return job, outputs

    def _drop(self, job: _Job) -> bool:
        """Abort ``job``; True if it was still waiting (it will never run)."""
        job.cancel.set()
        if not job.leave_queue(_JobState.DROPPED):
            return False
        with self._counts:
            self._queued -= 1
        return True

    async def abort(self, request_id: str) -> None:
        job = self._jobs.get(request_id)
        if job is not None and self._drop(job):
            job.deliver(ABORTED)

    def stats(self) -> EngineStats:
        running = list(self._running)
        held = sum(max(s.position, s.evaluated) for s in running)
        capacity = self._n_parallel * self._context_tokens
        return EngineStats(
            running=len(running), waiting=self._queued, kv_cache_usage=held / capacity
        )

    # --- the worker thread ---------------------------------------------------------

    def _work(self) -> None:
        stopping = False
        while not stopping or self._running:
            idle = not self._running and not self._waiting
            stopping = self._receive(block=idle and not stopping) or stopping
            self._retire_cancelled()
            if not stopping:
                self._admit()
            self._prefill()
            self._decode()
        # Shutting down: whatever still waits will not run.
        self._receive(block=False)
        for job in self._waiting:
            if self._drop(job):
                job.deliver(ABORTED)
        self._waiting.clear()

    def _receive(self, block: bool) -> bool:
        """Move new jobs to the waiting line (waiting for one if ``block``); True on stop."""
        stop = False
        try:
            item = self._inbox.get() if block else self._inbox.get_nowait()
            while True:
                if item is None:
                    stop = True
                elif isinstance(item, _Call):
                    self._call(item)
                else:
                    self._enqueue(item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            return stop

    @staticmethod
    def _call(call: _Call) -> None:
        try:
            value = call.run()
        except Exception as exc:
            value = exc
        call.done(value)

    def _enqueue(self, job: _Job) -> None:
        """Into the waiting line behind every job of its priority or a more urgent one."""
        urgency = job.sampling.priority
        at = next(
            (i for i, w in enumerate(self._waiting) if w.sampling.priority > urgency),
            len(self._waiting),
        )
        self._waiting.insert(at, job)

    def _retire_cancelled(self) -> None:
        for sequence in [s for s in self._running if s.job.cancel.is_set()]:
            self._leave(sequence)
            sequence.job.deliver(ABORTED)

    def _admit(self) -> None:
        """Give free slots to waiting jobs in line order (adapters take turns)."""
        while self._waiting:
            job = self._waiting[0]
            if job.state is _JobState.DROPPED:
                self._waiting.popleft()
                continue
            adapter = None if job.lora is None else job.lora.key
            if not may_join(adapter, self._on_context, len(self._running)):
                return
            choice = choose_slot(self._slots, job.prompt, adapter)
            if choice is None:
                return
            spare = spare_slots(self._slots, choice[0], job.sampling.n - 1)
            if spare is None:
                return  # its n sequences start together
            self._waiting.popleft()
            if not job.leave_queue(_JobState.RUNNING):
                continue  # aborted just now
            with self._counts:
                self._queued -= 1
            try:
                self._start(job, *choice, spare)
            except Exception as exc:
                job.deliver(exc)

    def _start(self, job: _Job, slot: Slot, reuse: int, spare: Sequence[Slot] = ()) -> None:
        """Put the job's first sequence in ``slot`` and the others (n > 1) in ``spare``."""
        assert self._ctx is not None
        adapter = None if job.lora is None else job.lora.key
        if adapter != self._on_context:
            self._ctx.use_adapter(None if job.lora is None else job.lora.pointer)
        self._on_context = adapter
        self._ctx.forget(slot.seq_id, reuse)  # the cached tail this prompt does not share
        first = self._sequence(job, slot, adapter, reuse, 0)
        for index, other in enumerate(spare, start=1):
            self._ctx.forget(other.seq_id, 0)  # its whole prompt comes from ``slot``
            sibling = self._sequence(job, other, adapter, 0, index)
            sibling.waits = True
            first.siblings.append(sibling)
        self._running.append(first)
        self._running.extend(first.siblings)

    def _sequence(
        self, job: _Job, slot: Slot, adapter: str | None, reuse: int, index: int
    ) -> _Sequence:
        """One sequence of ``job`` in ``slot`` (marked busy), with its own sampler.

        Seeded sequences after the first take the next seeds, as vLLM seeds its n.
        """
        params = job.sampling
        if index and params.seed is not None:
            params = dataclasses.replace(params, seed=params.seed + index)
        decoding = TokenDecoding(
            params=params,
            pieces=self._vocab.pieces(params.skip_special_tokens),
            ends_generation=self._vocab.ends_generation,
            stream=TextStream(params.stop, params.include_stop_str_in_output),
            limit=params.max_tokens,
            cumulative_logprob=0.0 if params.logprobs is not None else None,
        )
        sampler = _sampler_chain(params, job.grammar, self._llama._model.vocab, self._last_n)
        slot.busy, slot.adapter, slot.cached = True, adapter, job.prompt[:reuse]
        return _Sequence(job, slot, decoding, sampler, evaluated=reuse, index=index)

    def _leave(self, sequence: _Sequence) -> None:
        """Take a sequence out: its generated tokens' KV freed, its prompt's kept as cache."""
        assert self._ctx is not None
        if sequence not in self._running:
            return  # already left (its delivery failed after it finished)
        self._running.remove(sequence)
        if sequence.sampler is not None:
            llama_cpp.llama_sampler_free(sequence.sampler)
        slot = sequence.slot
        slot.cached = sequence.job.prompt[: sequence.evaluated]
        self._ctx.forget(slot.seq_id, len(slot.cached))
        self._tick += 1
        slot.busy, slot.last_used = False, self._tick

    def _prefill(self) -> None:
        """Evaluate the next prompt block of the oldest sequence still reading its prompt.

        A block is a call of its own (see llamacpp_slots: reuse by whole blocks), and the
        last one yields the sequence's first token.
        """
        sequence = next((s for s in self._running if s.prefilling and not s.waits), None)
        if sequence is None:
            return
        assert self._ctx is not None
        prompt, start = sequence.job.prompt, sequence.evaluated
        end = min(len(prompt), (start // PROMPT_BLOCK + 1) * PROMPT_BLOCK)
        seq_id = sequence.slot.seq_id
        try:
            self._ctx.decode(
                [(prompt[p], p, seq_id, p == len(prompt) - 1) for p in range(start, end)]
            )
            sequence.evaluated = sequence.position = end
            if not sequence.prefilling:
                for sibling in sequence.siblings:  # before the first may leave its slot
                    self._ctx.copy(seq_id, sibling.slot.seq_id)
                    sibling.evaluated = sibling.position = end
                    sibling.slot.cached = list(prompt)
                for each in (sequence, *sequence.siblings):
                    self._emit(each, end - start - 1)
        except Exception as exc:
            for each in (sequence, *sequence.siblings):
                self._leave(each)
            sequence.job.deliver(exc)

    def _decode(self) -> None:
        """One token for every generating sequence, in one call."""
        generating = [s for s in self._running if s.token is not None]
        if not generating:
            return
        assert self._ctx is not None
        items = [(s.token, s.position, s.slot.seq_id) for s in generating]
        try:
            rows = self._ctx.step(items)  # type: ignore[arg-type]  # generating: token is set
        except Exception as exc:
            for sequence in generating:
                self._leave(sequence)
                sequence.job.deliver(exc)
            return
        for sequence, row in zip(generating, rows, strict=True):
            sequence.position += 1
            try:
                self._emit(sequence, row)
            except Exception as exc:
                self._leave(sequence)
                sequence.job.deliver(exc)

    def _emit(self, sequence: _Sequence, index: int) -> None:
        """Sample the sequence's next token from output ``index`` and deliver its delta."""
        assert self._ctx is not None
        row, decoding = self._ctx.logits(index), sequence.decoding
        # Logprobs are the model's, read before end tokens are masked for sampling.
        raw = row.astype(np.float64) if decoding.params.logprobs is not None else None
        if decoding.forbids_end():
            row[self._vocab.ends_generation] = -np.inf
        if sequence.sampler is None:
            token = int(row.argmax())
        else:
            token = llama_cpp.llama_sampler_sample(sequence.sampler, self._ctx.ctx, index)
        logprob = None if raw is None else self._logprobs(raw, token, decoding.params.logprobs or 0)
        output = decoding.output(token, logprob)
        output.index = sequence.index
        sequence.token = None if output.finished else token
        if output.finished:  # out of its slot before the client can see the answer
            self._leave(sequence)
        sequence.job.deliver(output)

    def _logprobs(
        self, logits: npt.NDArray[np.float64], token: int, top: int
    ) -> tuple[PositionLogprobs, float]:
        logprobs = logits - logits.max()
        logprobs -= np.log(np.exp(logprobs).sum())
        chosen = float(logprobs[token])
        # As vLLM: the sampled token, plus the ``top`` most likely ones.
        ids = [token, *(int(t) for t in np.argsort(-logprobs)[:top] if t != token)]
        entry = {
            t: TokenLogprob(
                logprob=float(logprobs[t]),
                rank=int((logprobs > logprobs[t]).sum()) + 1,
                decoded_token=self._vocab.text(t),
            )
            for t in ids
        }
        return entry, chosen
