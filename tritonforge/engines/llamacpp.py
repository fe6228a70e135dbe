"""llama.cpp adapter (llama-cpp-python): the only module that imports llama_cpp.

The engine is one ``llama_cpp.Llama`` built from ``model.json`` (its keyword arguments,
as vLLM's ``model.json`` holds ``AsyncEngineArgs``), serving a GGUF file directly.

A llama.cpp context runs one sequence at a time, and its calls block. So requests
queue (FIFO) for one worker thread that owns the context; the event loop only moves
deltas. The queue is bounded by the runtime's ``max_inflight`` (keep it small in
config.pbtxt): past it a request gets the "busy" error at once rather than a wait of
unknown length. The worker checks for abort between tokens, so a cancelled request
stops costing compute after at most one token (prompt evaluation itself is not
interruptible), and a request aborted while queued never reaches the context.

llama.cpp hands back token ids; bytes become text through the core's
:class:`~tritonforge.engines.text_stream.TextStream` (UTF-8 safe, stop strings held back), so
streamed and non-streamed answers are the same text. Each request evaluates its whole
prompt from an empty KV cache: reusing a cached prefix would evaluate the last prompt
token alone, whose logits differ in the last bits from a batched evaluation, and a
seeded request would then not always reproduce.

LoRA: the adapters of ``multi_lora.json`` (each directory's ``adapter.gguf``) are loaded
once, at start, next to the model. The context runs one sequence at a time, so the
worker sets the request's adapter (or none) on the context before each request:
every listed adapter can be used, one per request, with no limit beyond memory.
"""

from __future__ import annotations

import asyncio
import ctypes
import queue
import threading
from collections.abc import AsyncIterator, Callable, Generator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp.llama_chat_format import Jinja2ChatFormatter
from llama_cpp.llama_grammar import LlamaGrammar

from tritonforge.engines.base import (
    ConfigFile,
    Engine,
    EngineOutput,
    EngineStats,
    PositionLogprobs,
    PreparedPrompt,
    RequestTracker,
    TokenLogprob,
    stop_on_thread,
)
from tritonforge.engines.gbnf import compile_grammar
from tritonforge.engines.lora import GGUF_ADAPTER_FILE, LORA_FILE, LoraAdapter
from tritonforge.engines.text_stream import TextStream, TokenDecoding
from tritonforge.serving.errors import RequestError
from tritonforge.serving.sampling import SamplingParams

# --- the model's vocabulary, read once ------------------------------------------


@dataclass(frozen=True)
class _Vocabulary:
    """Every token's bytes and end-of-generation flag, read when the model loads.

    llama.cpp answers these through one ctypes call per token; tables read once keep
    the per-token path of a request to list and array lookups.
    """

    plain: list[bytes]  # special tokens render as nothing (skip_special_tokens)
    with_special: list[bytes]  # special tokens render as their text
    ends_generation: np.ndarray  # bool per token id: EOS, EOT and the like

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


# --- one request in the worker's queue -------------------------------------------


class _JobState(Enum):
    QUEUED = "queued"
    RUNNING = "running"  # the worker took it
    DROPPED = "dropped"  # aborted before the worker took it: it never runs


@dataclass
class _Job:
    request_id: str
    prompt: list[int]
    sampling: SamplingParams
    grammar: LlamaGrammar | None
    deliver: Callable[[EngineOutput | BaseException], None]
    lora: Any = None  # the llama.cpp adapter to run with (None: the base model)
    cancel: threading.Event = field(default_factory=threading.Event)
    state: _JobState = _JobState.QUEUED
    lock: threading.Lock = field(default_factory=threading.Lock)

    def leave_queue(self, state: _JobState) -> bool:
        """Move a queued job to ``state``; False if it already left the queue.

        The worker (taking the job) and an abort (dropping it) race for a queued job;
        the lock makes exactly one of them win.
        """
        with self.lock:
            if self.state is not _JobState.QUEUED:
                return False
            self.state = state
            return True


ABORTED = EngineOutput(finished=True, finish_reason="abort")


class LlamaCppEngine(Engine):
    metric_prefix = "llamacpp"
    config_file = ConfigFile("model.json", path_keys=("model_path",))

    def __init__(self, llama_kwargs: dict[str, Any]) -> None:
        self._kwargs = llama_kwargs
        self._llama: Any = None
        self._formatter: Jinja2ChatFormatter | None = None
        self._vocab = _Vocabulary([], [], np.zeros(0, dtype=bool))
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._stopping = False
        self._jobs: RequestTracker[_Job] = RequestTracker(release=self._drop)
        self._queued = 0
        self._running = 0
        self._counts = threading.Lock()
        self._lora_files: dict[str, Path] = {}
        self._loras: dict[str, Any] = {}  # name -> llama_adapter_lora pointer, after start

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> LlamaCppEngine:
        if not settings.get("model_path"):
            raise ValueError("model.json: model_path (a GGUF file) is required")
        if not Path(settings["model_path"]).is_file():
            raise FileNotFoundError(
                f"model.json: model_path {settings['model_path']} is not a file"
            )
        # Logits for every position would cost n_ctx x n_vocab floats; logprobs read the
        # last position's logits directly instead.
        settings["logits_all"] = False
        settings.setdefault("verbose", False)
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
        self._llama = await asyncio.to_thread(lambda: llama_cpp.Llama(**self._kwargs))
        llama = self._llama
        for name, path in self._lora_files.items():
            pointer = llama_cpp.llama_adapter_lora_init(llama._model.model, str(path).encode())
            if not pointer:
                raise RuntimeError(f"{LORA_FILE}: llama.cpp could not load adapter {name!r}")
            self._loras[name] = pointer
        self._vocab = _Vocabulary.read(llama)
        template = llama.metadata.get("tokenizer.chat_template")
        if template:
            self._formatter = Jinja2ChatFormatter(
                template,
                eos_token=self._special_text(llama.token_eos()),
                bos_token=self._special_text(llama.token_bos()),
            )
        self._worker = threading.Thread(target=self._work, name="llamacpp-worker", daemon=True)
        self._worker.start()

    async def shutdown(self) -> None:
        self._stopping = True
        for job in self._jobs.handles():
            job.cancel.set()
        self._queue.put(None)
        await stop_on_thread(self._worker, threading.Thread.join)
        # Adapters belong to the model: llama.cpp frees them with it (freeing them here
        # as well would free them twice).
        self._loras.clear()
        if self._llama is not None:
            llama, self._llama = self._llama, None
            llama.close()

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
        return self._llama.n_ctx()

    @property
    def vocab_size(self) -> int:
        return self._llama.n_vocab()

    def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        # add_bos asks for the model's own special tokens (BOS only if its vocab says so);
        # special=True parses special-token text, as HF tokenizers do.
        return self._llama.tokenize(text.encode("utf-8"), add_bos=add_special_tokens, special=True)

    def render_chat(self, messages: tuple[dict[str, str], ...]) -> str:
        if self._formatter is None:
            raise RequestError("messages", "this GGUF has no chat template; send text_input")
        try:
            return self._formatter(messages=[dict(m) for m in messages]).prompt
        except ValueError as exc:  # the template's raise_exception()
            raise RequestError("messages", f"rejected by the chat template: {exc}") from None

    # --- requests ------------------------------------------------------------------

    def _grammar(self, sampling: SamplingParams) -> LlamaGrammar | None:
        spec = sampling.structured_outputs
        return None if spec is None else compile_grammar(spec, self._llama._model.vocab)

    async def generate(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingParams
    ) -> AsyncIterator[EngineOutput]:
        assert self._llama is not None, "engine not started"
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue[EngineOutput | BaseException] = asyncio.Queue()
        job = _Job(
            request_id,
            list(prompt.token_ids),
            sampling,
            self._grammar(sampling),
            lambda item: loop.call_soon_threadsafe(outputs.put_nowait, item),
            None if sampling.lora_name is None else self._loras[sampling.lora_name],
        )
        with self._counts:
            self._queued += 1
        self._queue.put(job)
        with self._jobs.track(request_id, job):
            while True:
                item = await outputs.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    return

    def _drop(self, job: _Job) -> bool:
        """Abort ``job``; True if it was still queued (it will never run)."""
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
        llama = self._llama
        used = llama.n_tokens / llama.n_ctx() if llama is not None and self._running else 0.0
        return EngineStats(running=self._running, waiting=self._queued, kv_cache_usage=used)

    # --- the worker thread ---------------------------------------------------------

    def _work(self) -> None:
        while (job := self._queue.get()) is not None:
            if not job.leave_queue(_JobState.RUNNING):
                continue  # aborted while queued
            with self._counts:
                self._queued -= 1
                self._running = 1
            try:
                self._run(job)
            except Exception as exc:
                job.deliver(exc)
            finally:
                with self._counts:
                    self._running = 0
        # Shutting down: whatever is still queued will not run.
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None and self._drop(job):
                job.deliver(ABORTED)

    def _logits_row(self) -> np.ndarray:
        """Raw logits the last sampled token was drawn from (valid until the next eval)."""
        pointer = llama_cpp.llama_get_logits_ith(self._llama._ctx.ctx, -1)
        return np.ctypeslib.as_array(pointer, shape=(self._llama.n_vocab(),)).astype(np.float64)

    def _logprobs(self, token: int, top: int) -> tuple[PositionLogprobs, float]:
        logits = self._logits_row()
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

    def _run(self, job: _Job) -> None:
        """Generate ``job`` to its end, delivering one delta per token."""
        decoding = self._begin(job)
        tokens = self._sample(job, decoding)
        try:
            for token in tokens:
                if job.cancel.is_set():
                    job.deliver(ABORTED)
                    return
                output = self._step(decoding, int(token))
                job.deliver(output)
                if output.finished:
                    return
        finally:
            tokens.close()

    def _begin(self, job: _Job) -> TokenDecoding:
        params, llama = job.sampling, self._llama
        # llama.cpp seeds are 32-bit and 0xFFFFFFFF means "random": fold into range.
        llama.set_seed(params.seed_or_random() % 0xFFFFFFFF)
        llama.reset()
        if self._loras:
            self._use_adapter(job.lora)
        return TokenDecoding(
            params=params,
            pieces=self._vocab.pieces(params.skip_special_tokens),
            ends_generation=self._vocab.ends_generation,
            stream=TextStream(params.stop, params.include_stop_str_in_output),
            limit=params.max_tokens,
            cumulative_logprob=0.0 if params.logprobs is not None else None,
        )

    def _use_adapter(self, lora: Any) -> None:
        """Put the request's adapter (None: none) on the context; the last one must go."""
        context = self._llama._ctx.ctx
        llama_cpp.llama_clear_adapter_lora(context)
        if lora is not None and llama_cpp.llama_set_adapter_lora(context, lora, 1.0) != 0:
            raise RuntimeError("llama.cpp could not apply the request's LoRA adapter")

    def _sample(self, job: _Job, decoding: TokenDecoding) -> Generator[int, Any, None]:
        """llama.cpp's token generator for ``job``, sampling as the common vocabulary says."""
        params, ends = job.sampling, decoding.ends_generation

        def forbid_end(_ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
            if params.ignore_eos or decoding.generated < params.min_tokens:
                logits[ends] = -np.inf
            return logits

        needs_processor = params.ignore_eos or params.min_tokens > 0
        return self._llama.generate(
            job.prompt,
            top_k=max(params.top_k, 0),
            top_p=params.top_p,
            min_p=params.min_p,
            typical_p=1.0,
            temp=params.temperature,
            repeat_penalty=params.repetition_penalty,
            frequency_penalty=params.frequency_penalty,
            presence_penalty=params.presence_penalty,
            logits_processor=[forbid_end] if needs_processor else None,
            grammar=job.grammar,
        )

    def _step(self, decoding: TokenDecoding, token: int) -> EngineOutput:
        """The delta for one sampled token (logprobs read before the next evaluation)."""
        logprobs = None
        if decoding.params.logprobs is not None:
            entry, chosen = self._logprobs(token, decoding.params.logprobs)
            logprobs = [entry]
            decoding.cumulative_logprob = (decoding.cumulative_logprob or 0.0) + chosen
        text, reason = decoding.advance(token)
        return EngineOutput(
            text=text,
            token_ids=[token],
            logprobs=logprobs,
            cumulative_logprob=decoding.cumulative_logprob,
            finished=reason is not None,
            finish_reason=reason,
        )
