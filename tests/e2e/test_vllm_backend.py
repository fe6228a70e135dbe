"""vllm_model end to end: real tritonserver, real vLLM engine, real SmolLM2."""

from __future__ import annotations

import json

import pytest
import requests

from tests.e2e.client import (
    LONG_GREEDY,
    Hold,
    compact_json_budget,
    generate,
    generate_stream_text,
    llm_inputs,
    metric,
    requests_cancelled,
    requests_running,
    run_reference,
    served_engine_settings,
    stream,
    wait_for,
)

MODEL = "vllm_model"
GREEDY = {"temperature": 0, "max_tokens": 24}
PROMPTS = [
    "The three primary colours are",
    "def fibonacci(n):",
    "Écris une phrase en français sur l'été:",
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Name another one."},
    ],
]

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server(triton_server):
    return triton_server


@pytest.mark.numerics
def test_non_streamed_text_echoes_prompt_unless_excluded(server) -> None:
    body = {"text_input": PROMPTS[0], "parameters": GREEDY}
    echoed = generate(server.http_url, MODEL, body)["text_output"]
    bare = generate(server.http_url, MODEL, {**body, "exclude_input_in_output": True})[
        "text_output"
    ]
    assert echoed == PROMPTS[0] + bare
    assert bare


OFFLINE = """
import json, os, sys
from vllm import LLM, SamplingParams
from vllm.platforms import current_platform
from tritonforge.engines.host_settings import for_this_host
args, prompts, chats = (json.loads(a) for a in sys.argv[1:4])
if __name__ == "__main__":
    # The settings the server's adapter resolves for this host (dtype, threads).
    host = for_this_host(args, current_platform.is_cpu())
    host.apply(os.environ)
    llm = LLM(**host.engine)
    greedy = SamplingParams(temperature=0, max_tokens=24)
    tokenizer = llm.get_tokenizer()
    # Chats as the server renders them: the chat template, then its tokens unchanged.
    chat_ids = [
        tokenizer.encode(
            tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )
        for m in chats
    ]
    inputs = list(prompts) + [{"prompt_token_ids": ids} for ids in chat_ids]
    # One prompt at a time, as the server serves them: batch shape changes bf16 numerics.
    texts = [llm.generate([p], greedy)[0].outputs[0].text for p in inputs]
    print("RESULT" + json.dumps(texts))
"""


@pytest.fixture(scope="module")
def offline(server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Offline ``LLM.generate`` on this machine, same engine settings (model.json).

    The reference for every test that depends on what the model says: greedy text
    differs between CPUs (bf16 kernels: AMX/oneDNN on Intel, AVX-512/AVX2 elsewhere),
    so it is derived here, never written into the test. Keys: each prompt, and
    ``json.dumps(messages)`` for each chat.
    """
    # the settings the server runs
    args, _, env = served_engine_settings(server.repository / MODEL / "1", ("model",))
    texts = run_reference(
        tmp_path_factory.mktemp("offline") / "offline.py",
        OFFLINE,
        [args, PROMPTS, CHATS],
        {**env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        timeout_s=600,
    )
    keys = PROMPTS + [json.dumps(m) for m in CHATS]
    return dict(zip(keys, texts, strict=True))


@pytest.mark.numerics
def test_greedy_parity_with_offline_vllm(server, offline: dict[str, str]) -> None:
    """Same model, same engine settings, offline LLM.generate: identical text."""
    served = [
        generate(
            server.http_url,
            MODEL,
            {"text_input": p, "exclude_input_in_output": True, "parameters": GREEDY},
        )["text_output"]
        for p in PROMPTS
    ]
    assert served == [offline[p] for p in PROMPTS]


@pytest.mark.numerics
@pytest.mark.parametrize("messages", CHATS, ids=["one-turn", "multi-turn"])
def test_chat_messages_use_the_chat_template(server, offline, messages: list[dict]) -> None:
    """`messages` is rendered by the model's chat template: the offline engine on the
    template's rendering gives the same greedy answer."""
    reply = generate(
        server.http_url,
        MODEL,
        {"messages": json.dumps(messages), "sampling_parameters": json.dumps(GREEDY)},
    )
    assert reply["text_output"] == offline[json.dumps(messages)], reply
    assert reply["text_output"].strip()


@pytest.mark.numerics
@pytest.mark.parametrize("prompt", PROMPTS)
def test_stream_concatenation_equals_non_streamed_text(server, prompt: str) -> None:
    full = generate(
        server.http_url,
        MODEL,
        {"text_input": prompt, "exclude_input_in_output": True, "parameters": GREEDY},
    )["text_output"]
    grpc_stream = stream(server.grpc_url, MODEL, llm_inputs(prompt, sampling=GREEDY))
    assert grpc_stream.error is None
    assert len(grpc_stream.responses) > 1  # really streamed
    assert grpc_stream.text == full
    sse = generate_stream_text(
        server.http_url, MODEL, {"text_input": prompt, "stream": True, "parameters": GREEDY}
    )
    assert sse == full


#: Always enough for the city answer below to close (compact, bounded fields).
CITY_BUDGET = compact_json_budget({"city": "x" * 24, "population": 10**9})

#: Forces multi-byte UTF-8 output whatever the CPU's numerics make the model prefer:
#: two- and three-byte characters, split over byte-level tokens.
MULTIBYTE = {"regex": "[éàüçñ日本語の]{12,24}"}


@pytest.mark.numerics
def test_multibyte_utf8_streams_exactly(server) -> None:
    prompt = "Écris une phrase en français sur l'été:"
    sampling = {"temperature": 0, "max_tokens": 40, "structured_outputs": MULTIBYTE}
    streamed = stream(server.grpc_url, MODEL, llm_inputs(prompt, sampling=sampling))
    whole = stream(server.grpc_url, MODEL, llm_inputs(prompt, sampling=sampling, stream=False))
    assert streamed.error is None and whole.error is None
    assert len(streamed.responses) > 1  # really streamed
    assert streamed.text == whole.text
    assert "\ufffd" not in whole.text  # no character was split between responses
    assert sum(ord(ch) > 127 for ch in whole.text) >= 6, whole.text


@pytest.mark.numerics
@pytest.mark.parametrize(
    ("constraint", "check"),
    [
        ({"choice": ["yes", "no"]}, lambda text: text in ("yes", "no")),
        ({"regex": "[0-9]{3}-[0-9]{4}"}, lambda text: len(text) == 8 and text[3] == "-"),
        (
            {
                "json": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "maxLength": 24},
                        "population": {"type": "integer", "minimum": 0, "maximum": 10**9},
                    },
                    "required": ["city", "population"],
                },
                # Any whitespace lets a greedy small model loop on newlines on some CPUs.
                "disable_any_whitespace": True,
            },
            lambda text: set(json.loads(text)) >= {"city", "population"},
        ),
    ],
)
def test_structured_outputs(server, constraint: dict, check) -> None:
    reply = generate(
        server.http_url,
        MODEL,
        {
            "messages": json.dumps(
                [{"role": "user", "content": "Give a city and its population."}]
            ),
            "sampling_parameters": json.dumps(
                {"temperature": 0, "max_tokens": CITY_BUDGET, "structured_outputs": constraint}
            ),
        },
    )
    assert "error" not in reply, reply
    assert check(reply["text_output"]), reply["text_output"]


def _running(server) -> float:
    return requests_running(server.metrics_url, "vllm", MODEL)


def _wait_running(server) -> bool:
    wait_for(lambda: _running(server) >= 1, timeout_s=10, what="the engine to report it running")
    return True


def _cancelled(server) -> float:
    return requests_cancelled(server.metrics_url, "vllm", MODEL)


@pytest.mark.speed
def test_grpc_stream_cancellation_aborts_engine_work(server) -> None:
    before = _cancelled(server)
    seen_running: list[float] = []
    result = stream(
        server.grpc_url,
        MODEL,
        llm_inputs(PROMPTS[0], sampling=LONG_GREEDY),
        stop_after=6,
        on_response=lambda n: n == 3 and seen_running.append(_wait_running(server)),
    )
    assert len(result.responses) == 6
    assert seen_running == [True]  # the engine was running it before the cancel
    wait_for(lambda: _cancelled(server) == before + 1, what="the request to be counted cancelled")
    wait_for(lambda: _running(server) == 0, what="the engine's running count to return to 0")


@pytest.mark.speed
def test_http_disconnect_aborts_engine_work(server) -> None:
    before = _cancelled(server)
    body = {
        "text_input": PROMPTS[0],
        "stream": True,
        "parameters": {"max_tokens": 1500, "ignore_eos": True},
    }
    with requests.post(
        f"http://{server.http_url}/v2/models/{MODEL}/generate_stream",
        json=body,
        stream=True,
        timeout=60,
    ) as reply:
        events = 0
        for line in reply.iter_lines():
            events += line.startswith(b"data: ")
            if events >= 3:
                break
    wait_for(lambda: _cancelled(server) == before + 1, what="the closed connection to cancel")
    wait_for(lambda: _running(server) == 0, what="the engine's running count to return to 0")


LONG_PROMPT = "word " * 2100


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (
            {"text_input": "hi", "sampling_parameters": "{not json"},
            "sampling_parameters: is not valid JSON",
        ),
        (
            {"text_input": "hi", "parameters": {"nonsense": 1}},
            "parameters.nonsense: unknown sampling parameter",
        ),
        (  # a NUL inside the key, named escaped: Triton's C-string message would end at it
            {"text_input": "hi", "sampling_parameters": json.dumps({"\x00": False})},
            "sampling_parameters.\\x00: unknown sampling parameter; accepted:",
        ),
        (
            {"text_input": "hi", "parameters": {"temperature": "warm"}},
            "parameters.temperature: expected a number",
        ),
        (
            {"text_input": "hi", "parameters": {"max_tokens": 0}},
            "parameters.max_tokens: must be >= 1",
        ),
        (
            {"text_input": "hi", "parameters": {"temperature": -1}},
            "parameters.temperature: must be in [0, 2], got -1",
        ),
        ({"text_input": "hi", "parameters": {"top_p": 0}}, "parameters.top_p: must be in (0, 1]"),
        ({"text_input": "hi", "parameters": {"top_p": 1.5}}, "parameters.top_p: must be in (0, 1]"),
        ({"text_input": ""}, "text_input: must not be empty"),
        ({"text_input": LONG_PROMPT}, "text_input: prompt is"),
        ({"messages": '[{"role": "user"}]'}, "messages[0].content: must be a string"),
        (
            {"text_input": "hi", "sampling_parameters": json.dumps({"stop_token_ids": [10**6]})},
            "stop_token_ids[0]: token id 1000000 is out of range",
        ),
        (
            {"text_input": "hi", "stream": True, "exclude_input_in_output": False},
            "exclude_input_in_output: must be true",
        ),
    ],
)
def test_bad_input_is_named_and_the_model_keeps_serving(server, body: dict, fragment: str) -> None:
    reply = generate(server.http_url, MODEL, body)
    assert fragment in reply.get("error", ""), reply
    ok = generate(server.http_url, MODEL, {"text_input": "Hello", "parameters": {"max_tokens": 2}})
    assert "text_output" in ok, ok


@pytest.mark.speed
def test_parallel_streams_are_batched_by_the_engine(server) -> None:
    """16 streams run together in the engine: each streams its first token while none has
    ended, the engine counts all 16 running, and every one keeps receiving tokens beside
    the 15 others. They are holds the test cancels, so no stream can end before the last
    one starts, however fast the engine steps."""
    wait_for(lambda: _running(server) == 0, what="an idle engine")
    holds = [Hold(server.grpc_url, MODEL, f"Story number {i}:") for i in range(16)]
    try:
        for hold in holds:
            hold.wait_responses()
        wait_for(lambda: _running(server) == 16, what="the engine to run all 16 at once")
        seen = [hold.responses for hold in holds]
        for hold, count in zip(holds, seen, strict=True):
            hold.wait_responses(count + 2)  # decoded beside the others
        assert not any(hold.ended for hold in holds)
    finally:
        for hold in holds:
            hold.cancel()
    wait_for(lambda: _running(server) == 0, what="the engine's running count to return to 0")


def test_metrics_match_the_requests_sent(server) -> None:
    url = server.metrics_url
    names = [
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:time_per_output_token_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
    ]
    wait_for(lambda: _running(server) == 0, what="an idle engine")
    before = {n: metric(url, n, model=MODEL) for n in names}
    prompt_tokens = 0
    for i in range(3):
        result = stream(
            server.grpc_url,
            MODEL,
            llm_inputs(
                f"Count to {i + 3}:",
                sampling={"max_tokens": 7, "ignore_eos": True, "temperature": 0},
                stream=False,
                return_num_input_tokens=True,
            ),
        )
        prompt_tokens += int(result.responses[0].as_numpy("num_input_tokens")[0])

    def deltas() -> dict[str, float]:
        return {n: metric(url, n, model=MODEL) - before[n] for n in names}

    wait_for(lambda: deltas()["vllm:e2e_request_latency_seconds_count"] == 3, what="metrics")
    assert deltas() == {
        "vllm:prompt_tokens_total": prompt_tokens,
        "vllm:generation_tokens_total": 21,
        "vllm:time_to_first_token_seconds_count": 3,
        "vllm:time_per_output_token_seconds_count": 18,  # one per token after the first
        "vllm:e2e_request_latency_seconds_count": 3,
    }
