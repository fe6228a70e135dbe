"""Synthetic engine: a scheduler and a real tokenizer, no model compute.

It answers every request the way a continuous-batching engine does — a waiting queue,
at most ``max_num_seqs`` running sequences, one step advancing every running sequence
by one token — but its tokens are drawn at random from the real tokenizer's vocabulary
instead of computed, common tokens more often than rare ones as in text (Zipf's law).
Time is simulated: a step takes ``step_ms`` (plus ``prefill_ms_per_token`` for every
prompt token admitted in it); with both 0 it is unpaced and never sleeps, so a
benchmark over it measures the serving path's own cost.
It load-tests Triton, ensembles, the OpenAI frontend, a deployment or the benchmark
runner on a machine without an accelerator.

Everything a client sees is the core's, as for the real engines: token ids become text
through :class:`~tritonforge.engines.text_stream.TokenDecoding` (multi-byte characters
whole, stop strings held back), ``max_tokens``/``min_tokens``/``ignore_eos``/stop token
ids/logprobs are honoured, and the metrics carry vLLM's names (``vllm:`` prefix,
``model`` label) so dashboards and autoscalers built for vLLM work against it.

Determinism: a request's tokens, its length and its logprobs follow from its seed and
its prompt's token ids (an unseeded request uses the engine's ``seed``), so the same
request always gets the same answer, as a greedy model would give. The length is drawn
from ``output_length`` (a contract's length distribution) and ends with the end-of-
sequence token, unless ``max_tokens`` comes first or ``ignore_eos`` is set.
"""

from __future__ import annotations

import array
import asyncio
import collections
import functools
import hashlib
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tritonforge.bench.contract import Fixed, LengthDistribution
from tritonforge.bench.workload import draw_length
from tritonforge.engines.base import (
    ConfigFile,
    EngineOutput,
    EngineStats,
    HFTokenizedEngine,
    Mailbox,
    MailboxStreams,
    PositionLogprobs,
    PreparedPrompt,
    RequestTracker,
    TokenLogprob,
)
from tritonforge.engines.text_stream import TextStream, TokenDecoding
from tritonforge.serving.errors import RequestError
from tritonforge.serving.sampling import SamplingParams

ABORTED = EngineOutput(finished=True, finish_reason="abort")

#: Unpaced (no step time), steps run back to back for this long before the event loop
#: takes its turn (arrivals, aborts, consumers): a loop turn costs more than a token, and
#: with the few sequences running at once under a fast consumer it would otherwise be
#: paid every step.
UNPACED_BURST_S = 0.001


class SyntheticSettings(BaseModel):
    """``model.json`` of a synthetic model; unknown keys are errors (a typo changes nothing)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokenizer: str = Field(description="HuggingFace tokenizer directory whose vocabulary is drawn")
    max_model_len: int = Field(default=2048, ge=2, description="context: prompt plus output")
    max_num_seqs: int = Field(default=256, ge=1, description="sequences running at once")
    step_ms: float = Field(default=0.0, ge=0, description="one step: every running sequence")
    prefill_ms_per_token: float = Field(default=0.0, ge=0, description="per admitted prompt token")
    output_length: LengthDistribution = Field(
        default=Fixed(dist="fixed", value=128), description="where the EOS token falls"
    )
    seed: int = Field(default=0, description="seed of requests that send none")
    kv_cache_tokens: int | None = Field(
        default=None, ge=1, description="KV capacity for the usage gauge (max_num_seqs x context)"
    )


def settings_error(exc: ValidationError) -> ValueError:
    """A pydantic error as one line per field: ``model.json: step_ms: Input should be ...``."""
    problems = [
        f"model.json: {'.'.join(str(p) for p in e['loc']) or '(file)'}: {e['msg']}"
        for e in exc.errors()
    ]
    return ValueError("; ".join(problems))


def byte_level_table() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for every byte (GPT-2's scheme), reversed.

    Printable Latin-1 bytes stand for themselves; the others are shifted past 255 in
    byte order. A token's string maps back to its exact bytes through this table.
    """
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


@dataclass(frozen=True)
class Vocabulary:
    """Every token's bytes, which ids may be drawn, and which end generation; read once."""

    plain: list[bytes]  # special tokens render as nothing (skip_special_tokens)
    with_special: list[bytes]  # special tokens render as their text
    drawable: list[int]  # ordinary tokens: what the synthetic model emits
    ends_generation: list[bool]
    eos: int

    @classmethod
    def read(cls, tokenizer: Any) -> Vocabulary:
        """From a transformers fast tokenizer; byte-level BPE maps back to exact bytes.

        Other tokenizers (SentencePiece and the like) fall back to each token decoded on
        its own, which is exact for whole-character tokens only.
        """
        size = len(tokenizer)
        special = set(tokenizer.added_tokens_decoder)
        strings = tokenizer.convert_ids_to_tokens(list(range(size)))
        byte_of = byte_level_table() if _is_byte_level(tokenizer) else None
        plain: list[bytes] = []
        for token, text in enumerate(strings):
            if token in special:
                plain.append(b"")
            elif byte_of is not None and all(c in byte_of for c in text):
                plain.append(bytes(byte_of[c] for c in text))
            else:
                plain.append(tokenizer.decode([token]).encode("utf-8"))
        with_special = [
            text.encode("utf-8") if token in special else plain[token]
            for token, text in enumerate(strings)
        ]
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ValueError("the tokenizer has no end-of-sequence token")
        ends = [False] * size
        ends[eos] = True
        ordinary = [t for t in range(size) if t not in special and plain[t]]
        # Most frequent first, as draw_rank expects: a BPE vocabulary numbers its merges
        # in the order they were learned, most frequent pair first; single bytes (lone
        # pieces of a UTF-8 character among them) come last.
        drawable = [t for t in ordinary if len(plain[t]) > 1] + [
            t for t in ordinary if len(plain[t]) == 1
        ]
        return cls(plain, with_special, drawable, ends, eos)

    def text(self, token: int) -> str:
        return self.with_special[token].decode("utf-8", "replace")


@functools.cache
def load_tokenizer(path: str) -> tuple[Any, Vocabulary]:
    """The tokenizer and its tables, read once per process (seconds: the loop must not wait)."""
    from transformers import AutoTokenizer  # imported here: reading settings stays cheap

    tokenizer = AutoTokenizer.from_pretrained(path)
    return tokenizer, Vocabulary.read(tokenizer)


def _is_byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    return type(decoder).__name__ == "ByteLevel"


def request_rng(seed: int, prompt: tuple[int, ...]) -> random.Random:
    """The random source of one request: its seed and its prompt decide everything."""
    digest = hashlib.blake2b(array.array("q", prompt).tobytes(), digest_size=8)
    digest.update(seed.to_bytes(16, "little", signed=True))
    return random.Random(int.from_bytes(digest.digest(), "little"))


def draw_rank(rng: random.Random, size: int) -> int:
    """A rank in ``[0, size)``, rank r about as likely as 1/(r+1): Zipf's law, as in text.

    Real output repeats its common tokens, and what the serving path does per token
    (detokenizing, building a response) meets them again; drawing every token of a
    vocabulary equally would make each stream a run of rare tokens no model writes.
    """
    return int((size + 1) ** rng.random()) - 1


@dataclass(eq=False)
class SyntheticSequence:
    """One request in the scheduler: its decoding state and its outputs' queue."""

    request_id: str
    prompt_tokens: int
    decoding: TokenDecoding
    rng: random.Random
    logprob_rng: random.Random
    length: int  # tokens to generate, the last one EOS (unless max_tokens comes first)
    outputs: Mailbox[EngineOutput | BaseException] = field(default_factory=Mailbox)
    done: bool = False  # finished, aborted or released: the scheduler drops it

    def finish(self, output: EngineOutput) -> None:
        """Deliver the last output once (a finished step or an abort, whichever comes first)."""
        if not self.done:
            self.done = True
            self.outputs.put(output)


class SyntheticEngine(MailboxStreams[SyntheticSequence], HFTokenizedEngine):
    """The scheduler (one asyncio task on the runtime's loop) and the request generators.

    Metrics carry vLLM's prefix: the engine stands in for a vLLM-like server.
    """

    metric_prefix = "vllm"
    config_file = ConfigFile("model.json", path_keys=("tokenizer",))

    def __init__(self, settings: SyntheticSettings) -> None:
        self.settings = settings
        self.max_running = settings.max_num_seqs
        self._max_context = settings.max_model_len
        self._vocab: Vocabulary | None = None
        self._waiting: collections.deque[SyntheticSequence] = collections.deque()
        self._running: list[SyntheticSequence] = []
        self._requests: RequestTracker[SyntheticSequence] = RequestTracker(release=self._release)
        self._work = asyncio.Event()
        self._scheduler: asyncio.Task[None] | None = None
        self._kv_tokens = settings.kv_cache_tokens or settings.max_num_seqs * settings.max_model_len

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> SyntheticEngine:
        try:
            return cls(SyntheticSettings(**settings))
        except ValidationError as exc:
            raise settings_error(exc) from None

    async def start(self) -> None:
        self._tokenizer, vocab = await asyncio.to_thread(load_tokenizer, self.settings.tokenizer)
        self._vocab, self._vocab_size = vocab, len(vocab.plain)
        self._scheduler = asyncio.get_running_loop().create_task(self._schedule())

    async def shutdown(self) -> None:
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            scheduler.cancel()
            await asyncio.gather(scheduler, return_exceptions=True)
        for sequence in self._requests.handles():
            sequence.finish(ABORTED)

    def failure(self) -> str | None:
        scheduler = self._scheduler
        if scheduler is None or not scheduler.done():
            return None
        error = None if scheduler.cancelled() else scheduler.exception()
        return f"the synthetic engine's scheduler stopped ({error!r})"

    def stats(self) -> EngineStats:
        running = [s for s in self._running if not s.done]
        used = sum(s.prompt_tokens + s.decoding.generated for s in running)
        waiting = sum(1 for s in self._waiting if not s.done)
        return EngineStats(len(running), waiting, min(used / self._kv_tokens, 1.0))

    # --- requests ------------------------------------------------------------------

    def _sequence(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingParams
    ) -> SyntheticSequence:
        assert self._vocab is not None, "engine not started"
        if sampling.structured_outputs is not None:
            raise RequestError(
                "sampling_parameters.structured_outputs",
                "the synthetic engine draws random tokens and cannot follow a structure",
            )
        seed = self.settings.seed if sampling.seed is None else sampling.seed
        rng = request_rng(seed, prompt.token_ids)
        length = draw_length(self.settings.output_length, rng)
        # EOS never comes before min_tokens, nor at all with ignore_eos.
        length = max(length, sampling.min_tokens + 1)
        vocab = self._vocab
        pieces = vocab.plain if sampling.skip_special_tokens else vocab.with_special
        decoding = TokenDecoding(
            params=sampling,
            pieces=pieces,
            ends_generation=vocab.ends_generation,
            stream=TextStream(sampling.stop, sampling.include_stop_str_in_output),
            limit=sampling.max_tokens,
            cumulative_logprob=0.0 if sampling.logprobs is not None else None,
        )
        logprob_rng = random.Random(rng.getrandbits(64))
        return SyntheticSequence(
            request_id, len(prompt.token_ids), decoding, rng, logprob_rng, length
        )

    def _submit(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingParams
    ) -> tuple[SyntheticSequence, Mailbox[EngineOutput | BaseException]]:
        """Into the waiting line; each step delivers the sequence's delta to its mailbox."""
        sequence = self._sequence(request_id, prompt, sampling)
        self._waiting.append(sequence)
        self._work.set()
        return sequence, sequence.outputs

    def _tracker(self) -> RequestTracker[SyntheticSequence]:
        return self._requests

    def _release(self, sequence: SyntheticSequence) -> None:
        """The request's generator ended (finished, or its consumer is gone): drop it."""
        sequence.done = True

    async def abort(self, request_id: str) -> None:
        sequence = self._requests.get(request_id)
        if sequence is not None:
            sequence.finish(ABORTED)

    # --- the scheduler -------------------------------------------------------------

    async def _schedule(self) -> None:
        """Admit, wait out the step's simulated time, advance every running sequence."""
        settings = self.settings
        step_s, prefill_s = settings.step_ms / 1000, settings.prefill_ms_per_token / 1000
        next_step = time.monotonic()
        while True:
            if not self._running and not self._waiting:
                self._work.clear()
                await self._work.wait()
                next_step = time.monotonic()
            admitted = self._admit()
            pause = step_s + prefill_s * admitted
            if pause > 0:
                # A steady cadence: the step's own work counts toward its time, and a
                # late step does not make the next ones catch up in a burst.
                next_step = max(next_step, time.monotonic() - pause) + pause
                await asyncio.sleep(next_step - time.monotonic())
                self._step()
            else:
                self._burst(prefill_s)
                await asyncio.sleep(0)  # let arrivals, aborts and consumers in

    def _admit(self) -> int:
        """Move waiting sequences into free running slots; their prompt tokens to prefill."""
        self._running = [s for s in self._running if not s.done]
        prompt_tokens = 0
        while self._waiting and len(self._running) < self.settings.max_num_seqs:
            sequence = self._waiting.popleft()
            if not sequence.done:  # aborted while waiting: it never runs
                self._running.append(sequence)
                prompt_tokens += sequence.prompt_tokens
        return prompt_tokens

    def _burst(self, prefill_s: float) -> None:
        """Unpaced: steps back to back for up to :data:`UNPACED_BURST_S`, admitting the
        sequences already waiting as slots free up (unless their prefill takes time:
        the scheduler's loop pauses for it)."""
        until = time.monotonic() + UNPACED_BURST_S
        self._step()
        while self._running and time.monotonic() < until:
            if self._waiting:  # _step already dropped the finished: admit only if any wait
                if prefill_s > 0:
                    return
                self._admit()
            self._step()

    def _step(self) -> None:
        for sequence in self._running:
            if sequence.done:
                continue
            output = self._next_output(sequence)
            if output.finished:
                sequence.finish(output)
            else:
                sequence.outputs.put(output)
        self._running = [s for s in self._running if not s.done]

    def _next_output(self, sequence: SyntheticSequence) -> EngineOutput:
        """One sequence's next token, as the delta an engine step would give."""
        decoding, vocab = sequence.decoding, self._vocab
        assert vocab is not None
        params = decoding.params
        if not params.ignore_eos and decoding.generated + 1 >= sequence.length:
            token = vocab.eos
        else:
            token = vocab.drawable[draw_rank(sequence.rng, len(vocab.drawable))]
        logprob = None
        if params.logprobs is not None:
            logprob = self._logprobs(sequence, token, params.logprobs)
        return decoding.output(token, logprob)

    def _logprobs(
        self, sequence: SyntheticSequence, token: int, top: int
    ) -> tuple[PositionLogprobs, float]:
        """The sampled token as the most likely one, then ``top - 1`` others, halving.

        The sampled token gets a probability in [0.2, 0.5); each next candidate half the
        one before, so the candidates' probabilities always sum below 1.
        """
        assert self._vocab is not None
        rng, vocab = sequence.logprob_rng, self._vocab
        probability = 0.2 + 0.3 * rng.random()
        entry = {token: TokenLogprob(logprob=math.log(probability), rank=1, decoded_token=None)}
        while len(entry) < max(top, 1):
            other = vocab.drawable[rng.randrange(len(vocab.drawable))]
            if other not in entry:
                probability /= 2
                rank = len(entry) + 1
                entry[other] = TokenLogprob(
                    logprob=math.log(probability), rank=rank, decoded_token=None
                )
        for candidate, value in entry.items():
            value["decoded_token"] = vocab.text(candidate)
        return entry, entry[token]["logprob"]
