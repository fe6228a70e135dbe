"""The synthetic engine on its own: the real SmolLM2 tokenizer, no server, no model.

Expectations are derived from the engine's own rules (seed → tokens, the length
distribution, the tokenizer's text), never from fixed words.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import RecordingChannel, RecordingMetrics, sampling_request, serve_once
from tritonforge.engines.base import EngineOutput, PreparedPrompt
from tritonforge.engines.config import load_engine_config
from tritonforge.engines.synthetic import (
    SyntheticEngine,
    byte_level_table,
    draw_rank,
    load_tokenizer,
)
from tritonforge.launch.launcher import MODEL_REPOSITORY
from tritonforge.paths import CACHE_DIR
from tritonforge.serving.errors import RequestError
from tritonforge.serving.sampling import SamplingParams

TOKENIZER = Path(os.environ.get("TRITONFORGE_MODELS", CACHE_DIR / "models")) / (
    "SmolLM2-135M-Instruct"
)
if not (TOKENIZER / "tokenizer.json").is_file():
    pytest.skip(f"no tokenizer at {TOKENIZER} (run make setup)", allow_module_level=True)

PROMPT = "Tell me a story about a lighthouse."


def engine(**settings: Any) -> SyntheticEngine:
    defaults: dict[str, Any] = {"tokenizer": str(TOKENIZER), "max_model_len": 4096}
    return SyntheticEngine.from_settings(defaults | settings)


def run(engine: SyntheticEngine, body: Callable[[], Awaitable[Any]]) -> Any:
    """Start the engine, run ``body`` on the same loop, shut it down."""

    async def main() -> Any:
        await engine.start()
        try:
            return await body()
        finally:
            await engine.shutdown()

    return asyncio.run(main())


async def collect(
    engine: SyntheticEngine, prompt: str = PROMPT, request_id: str = "r", **sampling: Any
) -> list[EngineOutput]:
    ids = tuple(engine.tokenize(prompt, add_special_tokens=True))
    return [
        o
        async for o in engine.generate(request_id, PreparedPrompt(ids), SamplingParams(**sampling))
    ]


def token_ids(outputs: list[EngineOutput]) -> list[int]:
    return [t for o in outputs for t in o.token_ids]


def text(outputs: list[EngineOutput]) -> str:
    return "".join(o.text for o in outputs)


# --- determinism, lengths, text ------------------------------------------------------


def test_a_seed_decides_the_answer() -> None:
    e = engine(output_length={"dist": "fixed", "value": 40})

    async def body() -> list[list[int]]:
        return [
            token_ids(await collect(e, seed=7, max_tokens=64)),
            token_ids(await collect(e, seed=7, max_tokens=64)),
            token_ids(await collect(e, seed=8, max_tokens=64)),
            token_ids(await collect(e, max_tokens=64)),  # unseeded: the engine's seed
            token_ids(await collect(e, max_tokens=64)),
            token_ids(await collect(e, prompt="Another prompt.", max_tokens=64)),
        ]

    same, again, other_seed, unseeded, unseeded_again, other_prompt = run(e, body)
    assert same == again and unseeded == unseeded_again
    assert same != other_seed and unseeded != other_prompt


def test_fixed_length_ends_with_eos_unless_max_tokens_or_ignore_eos() -> None:
    e = engine(output_length={"dist": "fixed", "value": 12})

    async def body() -> tuple[list[EngineOutput], ...]:
        return (
            await collect(e, max_tokens=100),
            await collect(e, max_tokens=5),
            await collect(e, max_tokens=30, ignore_eos=True),
            await collect(e, max_tokens=100, min_tokens=20),
        )

    natural, capped, ignoring, at_least = run(e, body)
    eos = e._tokenizer.eos_token_id
    assert len(token_ids(natural)) == 12 and natural[-1].token_ids == [eos]
    assert natural[-1].finish_reason == "stop" and natural[-1].text == ""
    assert len(token_ids(capped)) == 5 and capped[-1].finish_reason == "length"
    assert len(token_ids(ignoring)) == 30 and eos not in token_ids(ignoring)
    assert len(token_ids(at_least)) == 21 and at_least[-1].token_ids == [eos]
    assert all(o.finished == (i == len(natural) - 1) for i, o in enumerate(natural))


def test_lengths_follow_the_distribution() -> None:
    e = engine(output_length={"dist": "uniform", "min": 5, "max": 25})

    async def body() -> list[int]:
        return [len(token_ids(await collect(e, seed=s, max_tokens=100))) for s in range(60)]

    lengths = run(e, body)
    assert min(lengths) >= 5 and max(lengths) <= 25
    assert len(set(lengths)) >= 8  # spread over the range, not one value
    assert 10 < sum(lengths) / len(lengths) < 20  # mean 15


def test_text_is_the_tokenizer_decoding_of_the_ids() -> None:
    e = engine(output_length={"dist": "fixed", "value": 300})
    outputs = run(e, lambda: collect(e, seed=3, max_tokens=300))
    ids = token_ids(outputs)
    assert text(outputs) == e._tokenizer.decode(ids, skip_special_tokens=True)


def test_byte_level_pieces_rebuild_multibyte_text_exactly() -> None:
    tokenizer, vocab = load_tokenizer(str(TOKENIZER))
    sample = "naïve café — 日本語の文 🙂 Ünïcödé"
    ids = tokenizer.encode(sample, add_special_tokens=False)
    assert b"".join(vocab.plain[t] for t in ids) == sample.encode("utf-8")
    assert len(byte_level_table()) == 256


def test_stop_strings_end_the_text_where_the_natural_text_has_them() -> None:
    e = engine(output_length={"dist": "fixed", "value": 80})

    async def body() -> tuple[str, list[EngineOutput], list[EngineOutput]]:
        natural = text(await collect(e, seed=11, max_tokens=100))
        stop = natural[40:46]
        return (
            natural,
            await collect(e, seed=11, max_tokens=100, stop=(stop,)),
            await collect(
                e, seed=11, max_tokens=100, stop=(stop,), include_stop_str_in_output=True
            ),
        )

    natural, stopped, included = run(e, body)
    stop = natural[40:46]
    cut = natural.index(stop)
    assert text(stopped) == natural[:cut] and stopped[-1].finish_reason == "stop"
    assert text(included) == natural[: cut + len(stop)]


def test_logprobs_rank_the_sampled_token_first() -> None:
    e = engine(output_length={"dist": "fixed", "value": 10})
    outputs = run(e, lambda: collect(e, seed=1, max_tokens=10, logprobs=3))
    total = 0.0
    for output in outputs:
        (position,) = output.logprobs or []
        (token,) = output.token_ids
        assert len(position) == 3 and position[token]["rank"] == 1
        assert sum(2.718281828 ** c["logprob"] for c in position.values()) < 1
        total += position[token]["logprob"]
    assert outputs[-1].cumulative_logprob == pytest.approx(total)


def test_structured_output_is_refused_naming_the_field() -> None:
    e = engine()
    request = sampling_request(True, structured_outputs={"regex": "[a-z]+"})

    async def body() -> None:
        prepared = e.prepare(request)
        await anext(e.generate("r", prepared, request.sampling))

    with pytest.raises(RequestError) as info:
        run(e, body)
    assert info.value.field == "sampling_parameters.structured_outputs"


def test_settings_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match="step_ms: Input should be greater than or equal to 0"):
        engine(step_ms=-1)
    with pytest.raises(ValueError, match="stepms: Extra inputs are not permitted"):
        engine(stepms=1)
    with pytest.raises(ValueError, match=r"output_length\.uniform\.max"):
        engine(output_length={"dist": "uniform", "min": 3})


def test_the_shipped_model_reads_its_settings() -> None:
    version = MODEL_REPOSITORY / "synthetic_model" / "1"
    env = {"TRITONFORGE_MODELS": str(TOKENIZER.parent)}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        shipped = SyntheticEngine.from_config(load_engine_config(version, "model.json"), version)
    assert Path(shipped.settings.tokenizer) == TOKENIZER


# --- the scheduler -------------------------------------------------------------------


def test_max_num_seqs_runs_that_many_and_queues_the_rest() -> None:
    e = engine(max_num_seqs=2, step_ms=5, output_length={"dist": "fixed", "value": 4})
    firsts: dict[int, int] = {}
    lasts: dict[int, int] = {}
    seen: list[tuple[int, int, int]] = []  # (running, waiting, tokens so far)

    async def one(index: int) -> None:
        ids = tuple(e.tokenize(PROMPT, True))
        async for output in e.generate(str(index), PreparedPrompt(ids), SamplingParams(seed=index)):
            stats = e.stats()
            seen.append((stats.running, stats.waiting, 0))
            firsts.setdefault(index, len(seen))
            lasts[index] = len(seen)
            assert output.token_ids

    async def body() -> None:
        await asyncio.gather(*(one(i) for i in range(5)))

    run(e, body)
    assert max(running for running, _, _ in seen) == 2
    assert max(waiting for _, waiting, _ in seen) == 3
    # The third request starts only once one of the first two has ended.
    assert firsts[2] > min(lasts[0], lasts[1])
    assert e.stats().running == 0 and e.stats().waiting == 0


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every ``asyncio.sleep`` delay asked for while the test runs, in order."""
    delays: list[float] = []
    real_sleep = asyncio.sleep

    async def recording_sleep(delay: float, *args: Any) -> Any:
        delays.append(delay)
        return await real_sleep(delay, *args)

    monkeypatch.setattr(asyncio, "sleep", recording_sleep)
    return delays


def test_unpaced_never_sleeps_and_paced_keeps_its_steps(pauses: list[float]) -> None:
    unpaced = engine(output_length={"dist": "fixed", "value": 50})
    run(unpaced, lambda: collect(unpaced, max_tokens=50))
    assert pauses and set(pauses) == {0}

    pauses.clear()
    paced = engine(step_ms=4, prefill_ms_per_token=1, output_length={"dist": "fixed", "value": 5})
    started = time.monotonic()
    outputs = run(paced, lambda: collect(paced, max_tokens=5))
    elapsed = time.monotonic() - started
    prompt_tokens = len(paced.tokenize(PROMPT, True))
    # First step: the prompt's prefill plus one step; then one step per token. A busy
    # host may wake the loop late (shorter sleeps), never early: the total is a floor.
    first_step = (prompt_tokens + 4) / 1000
    assert len(outputs) == 5 and len(pauses) == 5
    assert pauses[0] <= first_step and all(p <= 0.004 for p in pauses[1:])
    assert elapsed >= first_step + 4 * 0.004


def test_unpaced_steps_run_several_to_a_loop_turn() -> None:
    e = engine(output_length={"dist": "fixed", "value": 200})
    turns = 0
    turn_of_token: list[int] = []

    async def ticker() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    def sink(output: EngineOutput) -> bool:
        turn_of_token.append(turns)
        return True

    async def body() -> None:
        ticking = asyncio.ensure_future(ticker())
        ids = tuple(e.tokenize(PROMPT, True))
        await e.push("r", PreparedPrompt(ids), SamplingParams(max_tokens=200), sink)
        ticking.cancel()

    run(e, body)
    assert len(turn_of_token) == 200
    # A loop turn costs more than a token: steps back to back share one.
    assert len(set(turn_of_token)) < len(turn_of_token)


def test_unpaced_steps_still_pause_for_a_waiting_requests_prefill(pauses: list[float]) -> None:
    e = engine(max_num_seqs=2, prefill_ms_per_token=1, output_length={"dist": "fixed", "value": 50})

    async def body() -> None:
        await asyncio.gather(
            collect(e, request_id="long"),
            collect(e, request_id="short", max_tokens=5),
            collect(e, request_id="waiting", max_tokens=5),
        )

    run(e, body)
    prompt_s = len(e.tokenize(PROMPT, True)) / 1000
    # The first two prompts' prefill at once; the third's when the short one frees its
    # slot, while the long one still runs (a pause is shortened by the step's own work).
    first, then = (p / prompt_s for p in pauses if p > 0)
    assert 1.5 < first <= 2 and 0.5 < then <= 1


def test_abort_ends_a_running_and_a_waiting_request() -> None:
    e = engine(max_num_seqs=1, step_ms=5, output_length={"dist": "fixed", "value": 1000})

    async def body() -> tuple[list[EngineOutput], list[EngineOutput]]:
        running = asyncio.ensure_future(collect(e, request_id="a", max_tokens=1000))
        waiting = asyncio.ensure_future(collect(e, request_id="b", max_tokens=1000))
        while e.stats().waiting != 1 or e.stats().running != 1:
            await asyncio.sleep(0.005)
        await e.abort("b")
        await e.abort("a")
        await e.abort("a")  # idempotent
        return await running, await waiting

    running, waiting = run(e, body)
    assert running[-1].finish_reason == "abort" and 0 < len(running) < 1000
    assert waiting == [EngineOutput(finished=True, finish_reason="abort")]


def test_a_consumer_that_goes_away_frees_its_slot() -> None:
    e = engine(max_num_seqs=1, step_ms=1, output_length={"dist": "fixed", "value": 1000})

    async def body() -> list[EngineOutput]:
        ids = tuple(e.tokenize(PROMPT, True))
        stream = e.generate("gone", PreparedPrompt(ids), SamplingParams(max_tokens=1000))
        await anext(stream)
        await stream.aclose()  # the runtime closes it when the client cancels
        return await collect(e, request_id="next", max_tokens=3)

    after = run(e, body)
    assert len(token_ids(after)) == 3 and e.stats().running == 0


def test_pushed_outputs_equal_the_iterated_ones_and_a_sink_that_stops_frees_its_slot() -> None:
    """``push`` (what the runtime uses) hands each step's delta to the sink as it is
    made: the same deltas as ``generate``; a sink returning False ends the request."""
    e = engine(max_num_seqs=1, step_ms=1, output_length={"dist": "fixed", "value": 12})

    async def body() -> tuple[list[EngineOutput], list[EngineOutput], list[EngineOutput]]:
        prompt = PreparedPrompt(tuple(e.tokenize(PROMPT, True)))
        pushed: list[EngineOutput] = []

        def keep(output: EngineOutput) -> bool:
            pushed.append(output)
            return True

        await e.push("a", prompt, SamplingParams(seed=5), keep)
        iterated = await collect(e, request_id="b", seed=5)
        stopped: list[EngineOutput] = []

        def first_only(output: EngineOutput) -> bool:
            stopped.append(output)
            return False

        await e.push("c", prompt, SamplingParams(max_tokens=1000), first_only)
        after = await collect(e, request_id="d", max_tokens=3)  # the one slot is free again
        return pushed, iterated, stopped + after

    pushed, iterated, stopped = run(e, body)
    assert pushed == iterated and pushed[-1].finished and len(pushed) == 12
    assert len(stopped) == 4 and not stopped[0].finished and stopped[-1].finished
    assert e.stats().running == 0


# --- through the runtime: metrics ----------------------------------------------------


def test_runtime_counts_the_engines_tokens() -> None:
    e = engine(output_length={"dist": "fixed", "value": 9})
    metrics = RecordingMetrics()
    request = sampling_request(True, max_tokens=50, seed=4)
    channel = serve_once(e, request, RecordingChannel(), metrics)
    (record,) = metrics.records
    assert record.outcome == "finished" and record.generation_tokens == 9
    assert record.prompt_tokens == len(e.tokenize("hi", True))
    assert channel.sent[-1][2] is True and not channel.errors()


def test_stats_report_running_waiting_and_kv_usage() -> None:
    # Requests long enough (1000 steps of 5 ms) that the first is still running whenever
    # the test looks, however late a busy host wakes it; both are aborted once seen.
    e = engine(max_num_seqs=1, step_ms=5, output_length={"dist": "fixed", "value": 1000})

    async def body() -> tuple[Any, Any]:
        tasks = [
            asyncio.ensure_future(collect(e, request_id=str(i), max_tokens=1000)) for i in range(2)
        ]
        while e.stats().running != 1:
            await asyncio.sleep(0.002)
        during = e.stats()
        for i in range(2):
            await e.abort(str(i))
        await asyncio.gather(*tasks)
        return during, e.stats()

    during, after = run(e, body)
    assert during.waiting == 1 and 0 < (during.kv_cache_usage or 0) <= 1
    assert (after.running, after.waiting, after.kv_cache_usage) == (0, 0, 0)
    assert e.metric_prefix == "vllm"


def test_a_scheduler_that_dies_is_reported_as_the_engines_failure() -> None:
    e = engine(output_length={"dist": "fixed", "value": 5})

    def broken_step() -> None:
        raise RuntimeError("step exploded")

    async def body() -> str | None:
        assert e.failure() is None
        e._step = broken_step  # type: ignore[method-assign]
        ids = tuple(e.tokenize(PROMPT, True))
        stream = e.generate("r", PreparedPrompt(ids), SamplingParams(max_tokens=5))
        waiting = asyncio.ensure_future(anext(stream))
        while e.failure() is None:
            await asyncio.sleep(0.001)
        waiting.cancel()
        return e.failure()

    assert "step exploded" in (run(e, body) or "")


def test_common_tokens_are_drawn_more_often_as_in_text() -> None:
    """Ranks follow Zipf's law: the top 1 % of a 49k vocabulary takes over half the draws."""
    rng, size = random.Random(7), 49_000
    ranks = [draw_rank(rng, size) for _ in range(20_000)]
    assert min(ranks) == 0 and max(ranks) < size
    head = sum(r < size // 100 for r in ranks) / len(ranks)
    tail = sum(r >= size // 2 for r in ranks) / len(ranks)
    assert head > 0.5 and 0 < tail < 0.1


def test_the_vocabulary_lists_merges_before_single_bytes() -> None:
    _, vocab = load_tokenizer(str(TOKENIZER))
    lengths = [len(vocab.plain[t]) for t in vocab.drawable]
    first_byte = lengths.index(1)
    assert first_byte > 0 and all(n == 1 for n in lengths[first_byte:])
    assert sorted(vocab.drawable) == sorted(set(vocab.drawable))
