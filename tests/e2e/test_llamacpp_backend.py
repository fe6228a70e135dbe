"""llamacpp_model specifics: sequences decoded together, slots, a bounded queue, prefix reuse.

The context decodes up to ``n_parallel`` sequences (model.json) together; requests
beyond them wait, first come first served, up to max_inflight (config.pbtxt); past that
a request gets an UNAVAILABLE "busy" error at once. Queue tests fill every slot with a
long request first, so the queue's state is deterministic, not a race. Expected texts
are never written here: each is the same request's answer on this server, run alone.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.client import (
    LONG_GREEDY,
    Hold,
    llm_inputs,
    metric,
    requests_cancelled,
    stream,
    wait_for,
)
from tritonforge.engines.config import load_engine_config
from tritonforge.engines.llamacpp import ADAPTER_KEYS
from tritonforge.launch.launcher import MODEL_REPOSITORY
from tritonforge.launch.model_store import DEFAULT_MODEL_NAME, SERVED_GGUF
from tritonforge.repo import pbtxt

MODEL = "llamacpp_model"
SHORT = {"temperature": 0, "max_tokens": 8, "ignore_eos": True}
GREEDY = {"temperature": 0, "max_tokens": 24}
SETTINGS = load_engine_config(MODEL_REPOSITORY / MODEL / "1", "model.json")
SLOTS = SETTINGS["n_parallel"]
MAX_INFLIGHT = int(
    pbtxt.parameters(pbtxt.read(MODEL_REPOSITORY / MODEL / "config.pbtxt"))["max_inflight"]
)

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server(triton_server):
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    if not client.is_model_ready(MODEL):
        pytest.skip(f"{MODEL} is not loaded (llama-cpp-python missing?)")
    client.close()
    return triton_server


def gauge(server, name: str) -> float:
    return metric(server.metrics_url, f"llamacpp:{name}", model=MODEL)


def cancelled(server) -> float:
    return requests_cancelled(server.metrics_url, "llamacpp", MODEL)


@contextlib.contextmanager
def every_slot_busy(server):
    """Every slot holds a long request (running) until the block ends."""
    wait_for(lambda: gauge(server, "num_requests_running") == 0, what="an idle engine")
    blockers = [
        Hold(server.grpc_url, MODEL, f"Tell a very long story, part {i}:", LONG_GREEDY)
        for i in range(SLOTS)
    ]
    try:
        for blocker in blockers:
            blocker.wait_responses()
        # The gauges follow the engine every poll interval: the last first token may be
        # out before the gauge counts its sequence.
        wait_for(lambda: gauge(server, "num_requests_running") == SLOTS, what="every slot busy")
        yield blockers
    finally:
        for blocker in blockers:
            blocker.cancel()


def timed_stream(server, prompt: str, sampling: dict, stamps: list[float], **flags: bool):
    """A streamed request whose responses' arrival times go to ``stamps``."""
    return stream(server.grpc_url, MODEL, llm_inputs(prompt, sampling=sampling, **flags),
                  on_response=lambda n: stamps.append(time.monotonic()))  # fmt: skip


def alone(server, prompt: str, sampling: dict = GREEDY) -> str:
    wait_for(lambda: gauge(server, "num_requests_running") == 0, what="an idle engine")
    result = stream(server.grpc_url, MODEL, llm_inputs(prompt, sampling=sampling, stream=False))
    assert result.error is None, result.error
    return result.text


# --- slots and the queue -------------------------------------------------------------


def test_queue_is_bounded_and_refuses_past_max_inflight(server) -> None:
    waiting, refused_count = MAX_INFLIGHT - SLOTS, 3
    sent = waiting + refused_count
    with every_slot_busy(server) as blockers, ThreadPoolExecutor(sent) as pool:
        inputs = [
            llm_inputs(f"Item {i}:", sampling=SHORT, return_num_output_tokens=True)
            for i in range(sent)
        ]
        futures = [pool.submit(stream, server.grpc_url, MODEL, i) for i in inputs]
        # The slots run, `waiting` more queue; the rest are refused at once.
        wait_for(lambda: sum(f.done() for f in futures) == refused_count,
                 what="the requests past the bound to be refused")  # fmt: skip
        wait_for(lambda: gauge(server, "num_requests_waiting") == waiting,
                 what=f"{waiting} queued requests")  # fmt: skip
        assert gauge(server, "num_requests_running") == SLOTS
        for blocker in blockers:
            blocker.cancel()  # frees the slots: the queue drains
        results = [f.result() for f in futures]
    refused = [str(r.error) for r in results if r.error is not None]
    served = [r for r in results if r.error is None]
    assert len(refused) == refused_count
    assert all(f"model is busy: {MAX_INFLIGHT} requests in flight" in e for e in refused), refused
    assert len(served) == waiting
    assert all(sum(int(n[0]) for n in r.outputs("num_output_tokens")) == 8 for r in served)
    wait_for(lambda: gauge(server, "num_requests_waiting") == 0, what="an empty queue")
    wait_for(lambda: gauge(server, "num_requests_running") == 0, what="an idle engine")


def test_queued_requests_start_in_arrival_order(server) -> None:
    """Slots are freed one at a time; each time the oldest waiting request starts (and,
    being long, keeps the slot, so the next one waits for the next slot)."""
    started: list[int] = []
    queued = []
    try:
        with every_slot_busy(server) as blockers:
            for i in range(3):
                queued.append(
                    Hold(
                        server.grpc_url,
                        MODEL,
                        f"Item {i}:",
                        LONG_GREEDY,
                        on_first=lambda i=i: started.append(i),
                    )
                )
                wait_for(lambda n=i + 1: gauge(server, "num_requests_waiting") == n,
                         what=f"{i + 1} queued")  # fmt: skip
            for i in range(3):
                blockers[i].cancel()
                wait_for(lambda n=i + 1: len(started) == n, what=f"request {i} to start")
                assert started == list(range(i + 1))
                wait_for(lambda n=2 - i: gauge(server, "num_requests_waiting") == n,
                         what=f"{2 - i} still queued")  # fmt: skip
    finally:
        for request in queued:
            request.cancel()


def test_request_cancelled_while_queued_never_runs(server) -> None:
    with every_slot_busy(server):
        before = cancelled(server)  # the blockers run: every earlier request is counted
        queued = Hold(server.grpc_url, MODEL, "Another long story:", LONG_GREEDY)
        wait_for(lambda: gauge(server, "num_requests_waiting") == 1, what="one queued request")
        queued.cancel()
        wait_for(lambda: cancelled(server) == before + 1, what="the queued request cancelled")
        wait_for(lambda: gauge(server, "num_requests_waiting") == 0, what="an empty queue")
        # No running sequence was interrupted.
        assert gauge(server, "num_requests_running") == SLOTS
    wait_for(lambda: cancelled(server) == before + 1 + SLOTS, what="the blockers cancelled")
    wait_for(lambda: gauge(server, "num_requests_running") == 0, what="an idle engine")


# --- sequences decoded together --------------------------------------------------------


def test_parallel_streams_interleave(server) -> None:
    """A stream sent while another runs is decoded beside it: it streams all its tokens
    while the running one keeps receiving its own. (A one-sequence engine would make it
    wait for the running stream to end, which only the test's cancel does.)"""
    wait_for(lambda: gauge(server, "num_requests_running") == 0, what="an idle engine")
    forced = {"temperature": 0, "max_tokens": 32, "ignore_eos": True}
    stamps: list[float] = []
    with Hold(server.grpc_url, MODEL, "Count to ten, take 0:") as running:
        running.wait_responses()
        result = timed_stream(server, "Count to ten, take 1:", forced, stamps,
                              return_num_output_tokens=True)  # fmt: skip
        assert not running.ended, running.error  # still running when the other ended
        during = [t for t in running.times if stamps[0] <= t <= stamps[-1]]
    assert result.error is None and result.outputs("num_output_tokens")
    # A response may carry more than one token.
    assert sum(int(n[0]) for n in result.outputs("num_output_tokens")) == 32
    assert len(during) >= 2, (len(during), len(stamps))


def first_token(server, prompt: str) -> str:
    """The greedy first token's text: it comes from the prompt's own evaluation calls,
    the same whatever decodes beside the sequence afterwards."""
    return alone(server, prompt, GREEDY | {"max_tokens": 1})


def test_cancelling_one_sequence_lets_the_others_finish(server) -> None:
    """The survivors of a cancel finish normally. Their whole text equals their text alone
    only with ``batch_invariant`` (see tests/unit/engines/test_llamacpp_batch_invariance.py):
    with bfloat16 weights a sequence decoded beside a neighbour slot is summed in another
    order than one decoded as a row of its own."""
    survivors = ["The three primary colours are", "Write a haiku about rain:"]
    firsts = [first_token(server, prompt) for prompt in survivors]
    sampling = GREEDY | {"max_tokens": 48, "ignore_eos": True}  # they outlast the cancel
    with Hold(server.grpc_url, MODEL, "Tell a very long story:") as doomed:
        doomed.wait_responses()
        started = threading.Semaphore(0)
        with ThreadPoolExecutor(len(survivors)) as pool:
            futures = [
                pool.submit(stream, server.grpc_url, MODEL, llm_inputs(p, sampling=sampling),
                            on_response=lambda n: n == 1 and started.release())
                for p in survivors
            ]  # fmt: skip
            for _ in survivors:  # both are decoding beside the doomed one: cancel it now
                assert started.acquire(timeout=120), "a survivor never started"
            doomed.cancel()
            results = [f.result() for f in futures]
    assert [r.error for r in results] == [None, None]
    for result, first in zip(results, firsts, strict=True):
        assert result.text.startswith(first) and len(result.text) > len(first)
    wait_for(lambda: gauge(server, "num_requests_running") == 0, what="the cancelled one gone")


def test_constrained_and_free_sequences_batched_together_keep_their_own_rules(server) -> None:
    """A grammar and a seed are per sequence: neither leaks into the sequence beside it
    (the free sequence's exact text beside others: see the cancel test above)."""
    free = "Paris is the capital of"
    first = first_token(server, free)
    choice = {"temperature": 0.8, "seed": 3, "max_tokens": 8,
              "structured_outputs": {"choice": ["yes", "no"]}}  # fmt: skip
    running = threading.Semaphore(0)
    with ThreadPoolExecutor(4) as pool:
        unconstrained = pool.submit(
            stream, server.grpc_url, MODEL,
            llm_inputs(free, sampling=GREEDY | {"ignore_eos": True},
                       return_num_output_tokens=True),
            on_response=lambda n: n == 1 and running.release(),
        )  # fmt: skip
        # Sent once the free one decodes: they run beside its 23 remaining tokens.
        assert running.acquire(timeout=120), "the free sequence never started"
        constrained = [pool.submit(stream, server.grpc_url, MODEL,
                                   llm_inputs("Is water wet? Answer:", sampling=choice))
                       for _ in range(3)]  # fmt: skip
        answers = {f.result().text for f in constrained}
        result = unconstrained.result()
    assert result.error is None and result.text.startswith(first)
    assert result.text.strip() not in {"yes", "no"}  # free to run past a one-word answer
    assert sum(int(n[0]) for n in result.outputs("num_output_tokens")) == GREEDY["max_tokens"]
    assert len(answers) == 1 and answers <= {"yes", "no"}, answers  # same seed, same answer


# --- prompt-prefix reuse ----------------------------------------------------------------


def chat(server, messages: list[dict]) -> str:
    wait_for(lambda: gauge(server, "num_requests_running") == 0, what="an idle engine")
    result = stream(server.grpc_url, MODEL, llm_inputs(None, messages=messages, sampling=GREEDY))
    assert result.error is None, result.error
    return result.text


def test_a_cached_prefix_gives_the_cold_runs_greedy_text(server) -> None:
    """A fresh id in front makes a prompt no slot has seen, so its first run is cold.

    The chat's second turn runs cold first; the first turn then takes that slot (their
    prompts share the history), leaving its own prompt there; the second turn again now
    evaluates only what follows the first turn's prompt, and must say the same.
    """
    history = f"Session {uuid.uuid4().hex}. " + "The river flows past the old mill. " * 40
    first_turn = [{"role": "user", "content": history + "What flows past the mill?"}]
    second_turn = [
        *first_turn,
        {"role": "assistant", "content": "The river."},
        {"role": "user", "content": "And what does the mill do?"},
    ]
    cold = chat(server, second_turn)
    assert chat(server, first_turn)
    assert chat(server, second_turn) == cold
    # The same text prompt twice: all but its last block comes from the cache.
    assert alone(server, history) == alone(server, history)


def test_engine_config_is_llama_keyword_arguments_plus_the_adapters_own() -> None:
    # the bfloat16 GGUF the model store writes (tritonforge/launch/model_store.py)
    assert SETTINGS["model_path"] == f"$TRITONFORGE_MODELS/{DEFAULT_MODEL_NAME}/{SERVED_GGUF}"
    assert json.dumps(SETTINGS)  # plain JSON, no engine objects
    assert SLOTS > 1 and "n_parallel" in ADAPTER_KEYS  # never handed to Llama()
    assert MAX_INFLIGHT > SLOTS  # room to wait before "busy"


def test_grammar_the_engine_cannot_parse_is_a_request_error(server) -> None:
    bad = {"max_tokens": 4, "structured_outputs": {"grammar": "root ::= ("}}
    result = stream(server.grpc_url, MODEL, llm_inputs("hi", sampling=bad))
    assert "structured_outputs.grammar: llama.cpp could not parse the grammar" in str(result.error)
    ok = stream(server.grpc_url, MODEL, llm_inputs("Hi", sampling=SHORT))
    assert ok.error is None and ok.text
