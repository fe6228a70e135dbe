"""ensemble_vllm and ensemble_vllm_py against vllm_model, on the session's real server.

The ensembles tokenize outside the LLM step and detokenize after it, one streamed
response at a time; greedy output must match vllm_model exactly, response by
response, multi-byte characters and leading spaces included.
"""

from __future__ import annotations

import json

import pytest
import requests

from tests.e2e.client import bytes_input, llm_inputs, stream

# Every test here compares the model's text: rerun under other CPU kernels too.
pytestmark = [pytest.mark.server, pytest.mark.numerics]

DIRECT = "vllm_model"
ENSEMBLES = ("ensemble_vllm", "ensemble_vllm_py")
GREEDY = {"temperature": 0, "max_tokens": 24}
PROMPTS = [
    "The three primary colours are",
    "Écris une phrase en français sur l'été:",
    "Translate to Japanese: good morning, friend ->",
]
# Which words a greedy 135M model prints depends on the CPU's bf16 kernels, so the
# multi-byte case does not rely on the prompts above: a structured output makes the
# engine write two- and three-byte characters (split over byte-level tokens) anywhere.
MULTIBYTE = {**GREEDY, "structured_outputs": {"regex": "[éàüçñ日本語の]{12,24}"}}
CASES = {prompt: GREEDY for prompt in PROMPTS} | {"Say something in Japanese:": MULTIBYTE}


@pytest.fixture(scope="module")
def server(triton_server):
    return triton_server


@pytest.fixture(scope="module")
def direct(server) -> dict[str, list[str]]:
    """vllm_model's streamed responses per prompt: the reference."""
    results = {}
    for prompt, sampling in CASES.items():
        result = stream(server.grpc_url, DIRECT, llm_inputs(prompt, sampling))
        assert result.error is None, result.error
        results[prompt] = result.texts()
    return results


@pytest.mark.parametrize("model", ENSEMBLES)
@pytest.mark.parametrize("prompt", list(CASES))
def test_streamed_greedy_output_equals_vllm_model_response_by_response(
    server, direct, model: str, prompt: str
) -> None:
    result = stream(server.grpc_url, model, llm_inputs(prompt, CASES[prompt]))
    assert result.error is None, result.error
    assert len(result.responses) > 1  # really streamed
    assert _cut_end(result.texts()) == _cut_end(direct[prompt])
    # No character split between responses: a streamed response decodes to no more
    # replacement characters than vLLM's whole text has (the model itself may emit an
    # invalid byte sequence; which one depends on the CPU's numerics).
    whole = stream(server.grpc_url, DIRECT, llm_inputs(prompt, CASES[prompt], stream=False))
    replaced = "".join(_cut_end(result.texts())).count("\ufffd")
    assert replaced == whole.text.rstrip("\ufffd").count("\ufffd"), result.texts()


def _cut_end(texts: list[str]) -> list[str]:
    """Responses with a trailing partial character dropped from the last one.

    When max_tokens ends a generation inside a multi-byte character, vllm_model's
    detokenizer drops the partial bytes ("") while the ensemble's stateless
    postprocessing decodes them to U+FFFD; everything before must match exactly.
    (Found by make test-numerics: float32 numerics end one prompt that way.)
    """
    return [*texts[:-1], texts[-1].rstrip("\ufffd")] if texts else texts


@pytest.mark.parametrize("model", ENSEMBLES)
def test_non_streamed_output_equals_vllm_model(server, direct, model: str) -> None:
    prompt = "Say something in Japanese:"
    result = stream(server.grpc_url, model, llm_inputs(prompt, MULTIBYTE, stream=False))
    assert result.error is None, result.error
    assert len(result.responses) == 1
    assert result.text == "".join(direct[prompt])


def test_return_flags_pass_through_the_ensemble(server) -> None:
    sampling = {**GREEDY, "ignore_eos": True}  # runs to max_tokens on any CPU
    inputs = llm_inputs(
        PROMPTS[0], sampling, return_finish_reason=True, return_num_output_tokens=True
    )
    result = stream(server.grpc_url, "ensemble_vllm", inputs)
    assert result.error is None, result.error
    assert result.texts("finish_reason")[-1] == "length"
    counts = [int(r.as_numpy("num_output_tokens")[0]) for r in result.responses]
    assert sum(counts) == GREEDY["max_tokens"]


def test_genai_perf_style_request_works(server) -> None:
    """genai-perf --backend vllm sends max_tokens as a string inside sampling_parameters."""
    sampling = {"max_tokens": "8", "ignore_eos": "true"}
    result = stream(server.grpc_url, "ensemble_vllm", llm_inputs(PROMPTS[0], sampling))
    assert result.error is None, result.error
    assert result.text


def test_bad_input_names_the_field_and_the_ensemble_stays_ready(server) -> None:
    # ensemble_vllm_py: see ensembles/README.md (known issue) for ensemble_vllm.
    # Triton 2.51 workaround W13, see docs/triton-2.51-workarounds.md.
    model = "ensemble_vllm_py"
    inputs = [
        bytes_input("text_input", "hi"),
        bytes_input("sampling_parameters", json.dumps({"temperature": -1})),
    ]
    result = stream(server.grpc_url, model, inputs)
    assert result.error is not None
    assert "sampling_parameters.temperature" in str(result.error)
    ready = requests.get(f"http://{server.http_url}/v2/models/{model}/ready", timeout=10)
    assert ready.status_code == 200
    again = stream(server.grpc_url, model, llm_inputs(PROMPTS[0], GREEDY))
    assert again.error is None and again.text
