"""LoRA end to end: real tritonserver, real vLLM and llama.cpp, two real adapters on SmolLM2.

The adapters are made at setup time with ``peft`` (tritonforge.launch.lora_store: seeded, saved
as safetensors under ``.cache/``). Expected text is never written here: the reference
is offline ``LLM.generate`` on this machine with the engine settings the server reads
(``model.json``) and the same ``LoRARequest`` per adapter, one prompt at a time as the
tests send them; for llama.cpp, llama-cpp-python itself with the same GGUF adapter. Both
LoRA models run on a server of their own (see OWN_SERVER_MODELS in tests/conftest.py):
one extra server start for this module, from a copy of their repository entries, since
adapters loaded at run time are written to the repository's multi_lora.json. An OpenAI
frontend beside it serves the adapter routes.
"""

from __future__ import annotations

import json
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.e2e.client import (
    StreamResult,
    bytes_input,
    control_model,
    generate,
    llm_inputs,
    metric,
    own_server_frontend,
    run_reference,
    served_engine_settings,
    stream,
)
from tests.e2e.readme_examples import Addresses, blocks, models, run_block
from tests.e2e.test_gateway_metrics import adapter_shows_then_leaves
from tritonforge.launch.launcher import OpenAIFrontend, TritonServer
from tritonforge.paths import MODEL_REPOSITORY

MODEL = "vllm_lora_model"
LLAMACPP = "llamacpp_lora_model"
GREEDY = {"temperature": 0, "max_tokens": 10}
#: The adapters are small random LoRAs: smol-alpha's greedy llama.cpp text leaves the
#: base model's at its 6th token, or its 13th with flash_attn (measured here).
LLAMACPP_GREEDY = {"temperature": 0, "max_tokens": 24}
PROMPT = "The three primary colours are"
#: The base model (None) and both adapters of multi_lora.json.
VARIANTS = (None, "smol-alpha", "smol-beta")

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """The two LoRA models, after their adapters exist (made once, cached under .cache/),
    served from a copy of their repository entries (run-time loads write to it)."""
    from tritonforge.launch.lora_store import ensure_adapters

    ensure_adapters(quiet=True)
    root = tmp_path_factory.mktemp("lora")
    for model in (MODEL, LLAMACPP):
        shutil.copytree(MODEL_REPOSITORY / model, root / "repository" / model)
    settings = {"models": [MODEL, LLAMACPP], "repository": root / "repository"}
    with TritonServer.on_free_ports(**settings, log_path=root / "server.log") as own:
        yield own


#: The OpenAI frontend in front of this module's server (the adapter routes).
openai = own_server_frontend("lora")


OFFLINE = """
import json, os, sys
from vllm import LLM, SamplingParams
from vllm.platforms import current_platform
from tritonforge.engines.host_settings import for_this_host
from vllm.lora.request import LoRARequest
args, adapters, prompt, greedy = (json.loads(a) for a in sys.argv[1:5])
if __name__ == "__main__":
    # The settings the server's adapter resolves for this host (dtype, threads).
    host = for_this_host(args, current_platform.is_cpu())
    os.environ.update(host.env)
    llm = LLM(**host.engine)
    requests = {None: None} | {
        name: LoRARequest(name, int_id, path) for name, int_id, path in adapters
    }
    texts = {
        str(name): llm.generate([prompt], SamplingParams(**greedy), lora_request=lora)[0]
        .outputs[0].text
        for name, lora in requests.items()
    }
    print("RESULT" + json.dumps(texts))
"""


@pytest.fixture(scope="module")
def offline(server, tmp_path_factory: pytest.TempPathFactory) -> dict[str | None, str]:
    """Offline greedy text per variant: same engine settings, same LoRARequest (name, id, path)."""
    args, loras, env = served_engine_settings(server.repository / MODEL / "1", ("model",))
    adapters = [(a.name, a.int_id, str(a.path)) for a in loras]
    texts = run_reference(
        tmp_path_factory.mktemp("offline") / "offline.py",
        OFFLINE,
        [args, adapters, PROMPT, GREEDY],
        {**env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        timeout_s=900,
    )
    return {variant: texts[str(variant)] for variant in VARIANTS}


def ask(server: TritonServer, lora: str | None, model: str = MODEL) -> str:
    """One greedy request over gRPC, naming the adapter with the ``lora_name`` tensor."""
    inputs = llm_inputs(PROMPT, LLAMACPP_GREEDY if model == LLAMACPP else GREEDY, stream=False)
    if lora is not None:
        inputs.append(bytes_input("lora_name", lora))
    result = stream(server.grpc_url, model, inputs, timeout_s=300)
    assert result.error is None, result.error
    return result.text


def test_each_adapter_changes_the_greedy_answer(offline) -> None:
    base = offline[None]
    assert base and offline["smol-alpha"] != base and offline["smol-beta"] != base
    assert offline["smol-alpha"] != offline["smol-beta"]


def test_served_answer_equals_offline_vllm_with_the_same_lora_request(server, offline) -> None:
    served = {variant: ask(server, variant) for variant in VARIANTS}
    assert served == offline


def test_lora_name_as_sampling_key_over_http_generate(server, offline) -> None:
    """The other spelling: ``lora_name`` among the sampling keys (/generate parameters)."""
    body = {
        "text_input": PROMPT,
        "exclude_input_in_output": True,
        "parameters": {**GREEDY, "lora_name": "smol-beta"},
    }
    assert generate(server.http_url, MODEL, body)["text_output"] == offline["smol-beta"]


def shared_prefix(a: str, b: str) -> int:
    """How many leading characters ``a`` and ``b`` have in common."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def test_adapters_and_base_interleaved_concurrently_keep_their_own_answers(server, offline) -> None:
    """Six requests in flight at once, base and both adapters interleaved: vLLM batches
    them together, each with its own adapter (or none).

    A batch's GEMMs have other shapes than one request's, so a greedy near-tie may resolve
    otherwise than offline one at a time (seen once in CI: the base model's text left the
    offline one at its 9th token). What the batch must keep is each request's own adapter:
    every answer follows its variant's offline text past the point where that text parts
    from the other variants' texts.
    """
    order = [*VARIANTS, *reversed(VARIANTS)]
    with ThreadPoolExecutor(len(order)) as pool:
        answers = list(pool.map(lambda lora: ask(server, lora), order))
    for lora, answer in zip(order, answers, strict=True):
        own = shared_prefix(answer, offline[lora])
        others = {v: shared_prefix(answer, offline[v]) for v in VARIANTS if v != lora}
        assert all(own > shared for shared in others.values()), (lora, answer, offline)


def test_unknown_lora_name_is_invalid_arg_listing_the_adapters(server, offline) -> None:
    inputs = [*llm_inputs(PROMPT, GREEDY, stream=False), bytes_input("lora_name", "smol-gamma")]
    result = stream(server.grpc_url, MODEL, inputs)
    assert result.error is not None
    message = str(result.error)
    assert "lora_name: unknown LoRA adapter 'smol-gamma'; available: smol-alpha, smol-beta" in (
        message
    )
    # Triton 2.51's gRPC stream carries the error message without its code; /generate
    # answers the same rule. The model stays ready and keeps answering.
    body = {"text_input": PROMPT, "parameters": {"lora_name": "smol-gamma"}}
    assert "available: smol-alpha, smol-beta" in generate(server.http_url, MODEL, body)["error"]
    assert ask(server, "smol-alpha") == offline["smol-alpha"]


def test_metrics_tell_adapters_apart(server) -> None:
    def finished(lora: str) -> float:
        return metric(
            server.metrics_url,
            "vllm:lora_request_outcome_total",
            model=MODEL,
            lora=lora,
            outcome="finished",
        )

    def tokens(lora: str) -> float:
        return metric(server.metrics_url, "vllm:lora_generation_tokens_total", lora=lora)

    before = {lora: (finished(lora), tokens(lora)) for lora in ("smol-alpha", "smol-beta")}
    all_before = metric(server.metrics_url, "vllm:request_outcome_total", model=MODEL)
    for lora in ("smol-alpha", "smol-alpha", None):
        ask(server, lora)
    assert finished("smol-alpha") == before["smol-alpha"][0] + 2
    assert tokens("smol-alpha") > before["smol-alpha"][1]
    assert (finished("smol-beta"), tokens("smol-beta")) == before["smol-beta"]
    # The model's own counter still counts every request, adapter or not.
    assert metric(server.metrics_url, "vllm:request_outcome_total", model=MODEL) == all_before + 3


# --- llama.cpp ----------------------------------------------------------------------

LLAMACPP_OFFLINE = """
import json, sys
import llama_cpp
settings, adapters, prompt, max_tokens = (json.loads(a) for a in sys.argv[1:5])
llm = llama_cpp.Llama(**settings, verbose=False)
pointers = {n: llama_cpp.llama_adapter_lora_init(llm._model.model, p.encode()) for n, p in adapters}
ids = llm.tokenize(prompt.encode(), add_bos=True, special=True)
texts = {}
for name in ["None", *pointers]:
    llama_cpp.llama_clear_adapter_lora(llm._ctx.ctx)
    if name != "None":
        assert llama_cpp.llama_set_adapter_lora(llm._ctx.ctx, pointers[name], 1.0) == 0
    llm.reset()
    out = []
    for token in llm.generate(ids, top_k=1, temp=0.0):
        if llama_cpp.llama_token_is_eog(llm._model.vocab, token):
            break
        out.append(token)
        if len(out) == max_tokens:
            break
    texts[name] = llm.detokenize(out).decode("utf-8", "replace")
print("RESULT" + json.dumps(texts))
"""


@pytest.fixture(scope="module")
def llamacpp_offline(server, tmp_path_factory: pytest.TempPathFactory) -> dict[str | None, str]:
    """llama-cpp-python itself, greedy, with each adapter's GGUF set on its context."""
    from tritonforge.engines.lora import GGUF_ADAPTER_FILE

    version_dir = server.repository / LLAMACPP / "1"
    settings, loras, env = served_engine_settings(version_dir, ("model_path",))
    adapters = [(a.name, str(a.path / GGUF_ADAPTER_FILE)) for a in loras]
    texts = run_reference(
        tmp_path_factory.mktemp("llamacpp") / "offline.py",
        LLAMACPP_OFFLINE,
        [settings, adapters, PROMPT, LLAMACPP_GREEDY["max_tokens"]],
        env,
        timeout_s=600,
    )
    return {variant: texts[str(variant)] for variant in VARIANTS}


def test_llamacpp_adapters_change_the_answer_as_llama_cpp_itself_does(
    server, llamacpp_offline
) -> None:
    served = {variant: ask(server, variant, LLAMACPP) for variant in VARIANTS}
    assert served == llamacpp_offline
    assert len(set(served.values())) == 3  # base and both adapters answer differently


def test_llamacpp_switches_adapters_between_queued_requests(server, llamacpp_offline) -> None:
    """One adapter on the context at a time, so adapters take turns: each request runs
    with its own adapter, and none is left on the context for the next (base after
    adapter answers as base).

    Each wave queues one request per variant, in both orders. Two requests with the same
    adapter would decode as one batch, and a batch's LoRA matmuls sum in another order
    than one sequence's: a near-tie in the greedy text may then differ from llama.cpp
    run alone, which is numerics, not the adapter switch under test.
    """
    for wave in (list(VARIANTS), list(reversed(VARIANTS))):
        with ThreadPoolExecutor(len(wave)) as pool:
            answers = list(pool.map(lambda lora: ask(server, lora, LLAMACPP), wave))
        assert answers == [llamacpp_offline[lora] for lora in wave], wave


def test_llamacpp_unknown_lora_name_lists_the_adapters(server) -> None:
    body = {"text_input": PROMPT, "lora_name": "smol-gamma", "parameters": GREEDY}
    error = generate(server.http_url, LLAMACPP, body)["error"]
    assert "unknown LoRA adapter 'smol-gamma'; available: smol-alpha, smol-beta" in error


def test_readme_lora_examples(server, openai) -> None:
    """README.md's LoRA requests answer on this module's server (the session server does not
    load the LoRA models); shape only, as tests/e2e/test_readme_examples.py checks the rest.
    The run-time examples load an adapter and unload it again."""
    examples = [b for b in blocks() if b.is_request() and models(b) & {MODEL, LLAMACPP}]
    assert examples, "README.md has no LoRA request example"
    openai_address = openai.base_url.removeprefix("http://").removesuffix("/v1")
    for block in examples:
        run_block(block, Addresses(server.http_url, server.grpc_url, openai_address))


def test_the_gateway_picker_sees_an_adapter_in_flight(server) -> None:
    """deploy/k8s/gateway's endpoint picker routes by lora_requests_info's adapter labels."""
    adapter_shows_then_leaves(server)


# --- adapters loaded at run time --------------------------------------------------------

#: Still streaming (63 tokens to go after the first) when an adapter is loaded or
#: unloaded beside it; whether the load outlasts it depends on the CPU, not on the rule.
LONG = {"temperature": 0, "max_tokens": 64, "ignore_eos": True}


def post(openai: OpenAIFrontend, route: str, body: dict) -> requests.Response:
    return requests.post(f"{openai.base_url}/{route}", json=body, timeout=300)


def listed_adapters(openai: OpenAIFrontend) -> dict[str, str]:
    """/v1/models' adapters: listed id -> parent model."""
    data = requests.get(f"{openai.base_url}/models", timeout=60).json()["data"]
    return {card["id"]: card["parent"] for card in data if card.get("parent")}


def repository_adapters(server: TritonServer, model: str) -> dict[str, str]:
    path = server.repository / model / "1" / "multi_lora.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def error_of(reply: requests.Response) -> tuple[int, str | None, str]:
    error = reply.json()["error"]
    return reply.status_code, error["param"], error["message"]


class InFlight:
    """Greedy streams on one adapter, started now and followed to their end."""

    def __init__(self, server: TritonServer, model: str, lora: str, count: int) -> None:
        self.results: list[StreamResult] = []
        self.started = threading.Semaphore(0)
        inputs = [*llm_inputs(PROMPT, LONG), bytes_input("lora_name", lora)]

        def run() -> None:
            first = threading.Event()

            def seen(_: int) -> None:
                if not first.is_set():
                    first.set()
                    self.started.release()

            result = stream(server.grpc_url, model, inputs, timeout_s=600, on_response=seen)
            if not first.is_set():
                self.started.release()
            self.results.append(result)

        self.threads = [threading.Thread(target=run) for _ in range(count)]
        for thread in self.threads:
            thread.start()
        for _ in range(count):  # every stream has its first token: they are running
            assert self.started.acquire(timeout=600)

    def running(self) -> bool:
        return any(thread.is_alive() for thread in self.threads)

    def texts(self) -> list[str]:
        """Their texts once all have ended, sorted (which stream ran first is not fixed)."""
        for thread in self.threads:
            thread.join(600)
        assert all(r.error is None for r in self.results), [r.error for r in self.results]
        return sorted(r.text for r in self.results)


def undisturbed(server: TritonServer, model: str, count: int) -> list[str]:
    """What ``count`` LONG smol-alpha streams answer with nothing loaded or unloaded beside.

    vLLM on CPU is not batch-invariant: of two streams started together one may answer
    otherwise than alone, depending on how their steps were batched. So its check runs one
    stream, alone in the engine but for the load or unload; llama.cpp's answers do not
    depend on their batch (docs/engines.md), so two run there.
    """
    return InFlight(server, model, "smol-alpha", count).texts()


def test_vllm_adapter_loaded_at_run_time_serves_beside_running_streams(
    server, openai, offline
) -> None:
    """smol-beta's weights loaded as smol-delta into the running engine answer as smol-beta
    does, over the OpenAI API too; streams on smol-alpha running meanwhile end unharmed;
    the repository lists it until it is unloaded; bad loads are named 4xx and change
    nothing."""
    beta = repository_adapters(server, MODEL)["smol-beta"]  # as written: $TRITONFORGE_MODELS/…
    alone = undisturbed(server, MODEL, count=1)
    running = InFlight(server, MODEL, "smol-alpha", count=1)
    assert running.running()  # the load is sent while the stream generates
    load = {"lora_name": "smol-delta", "lora_path": beta, "base_model_name": MODEL}
    reply = post(openai, "load_lora_adapter", load)
    assert reply.status_code == 200 and "smol-delta" in reply.text, reply.text
    # The stream on smol-alpha ran through the load whole, answering as without it.
    assert running.texts() == alone
    assert ask(server, "smol-delta") == offline["smol-beta"]
    answer = post(openai, "completions", {"model": "smol-delta", "prompt": PROMPT, **GREEDY})
    assert answer.status_code == 200 and answer.json()["model"] == "smol-delta"
    assert answer.json()["choices"][0]["text"] == offline["smol-beta"]
    assert listed_adapters(openai)["smol-delta"] == MODEL
    assert repository_adapters(server, MODEL)["smol-delta"] == beta

    assert error_of(post(openai, "load_lora_adapter", load))[:2] == (400, "lora_name")
    missing = {**load, "lora_name": "smol-none", "lora_path": "/no/such/adapter"}
    assert error_of(post(openai, "load_lora_adapter", missing))[:2] == (404, "lora_path")
    wide = server.repository.parent / "wide"
    served = served_engine_settings(server.repository / MODEL / "1", ("model",))[1]
    shutil.copytree(next(a.path for a in served if a.name == "smol-beta"), wide)
    config = json.loads((wide / "adapter_config.json").read_text())
    (wide / "adapter_config.json").write_text(json.dumps({**config, "r": 16}))
    too_wide = {**load, "lora_name": "smol-wide", "lora_path": str(wide)}
    status, param, message = error_of(post(openai, "load_lora_adapter", too_wide))
    assert (status, param) == (400, "lora_path") and "max_lora_rank 8" in message, message

    running = InFlight(server, MODEL, "smol-alpha", count=1)
    assert running.running()
    reply = post(openai, "unload_lora_adapter", {"lora_name": "smol-delta"})
    assert reply.status_code == 200, reply.text
    assert running.texts() == alone
    again = post(openai, "unload_lora_adapter", {"lora_name": "smol-delta"})
    assert error_of(again)[:2] == (404, "lora_name")
    assert "smol-delta" not in listed_adapters(openai)
    assert set(repository_adapters(server, MODEL)) == {"smol-alpha", "smol-beta"}
    gone = post(openai, "completions", {"model": "smol-delta", "prompt": PROMPT, **GREEDY})
    assert gone.status_code == 404
    assert ask(server, None) == offline[None]  # the model kept serving throughout


def test_llamacpp_adapter_loaded_at_run_time_survives_a_model_reload(
    server, openai, llamacpp_offline
) -> None:
    """A plain Triton client loads smol-beta's GGUF as smol-epsilon beside the running
    llama.cpp model (lora_control over /generate); a reload of the model reads it back from
    multi_lora.json; the OpenAI route unloads it."""
    beta = repository_adapters(server, LLAMACPP)["smol-beta"]
    baseline = undisturbed(server, LLAMACPP, count=2)
    running = InFlight(server, LLAMACPP, "smol-alpha", count=2)
    assert running.running()  # the load is sent while the streams generate
    body = {"lora_control": "load", "lora_name": "smol-epsilon", "lora_path": beta}
    answer = generate(server.http_url, LLAMACPP, body)
    assert "error" not in answer, answer
    assert "smol-epsilon" in json.loads(answer["text_output"])["adapters"]
    assert ask(server, "smol-epsilon", LLAMACPP) == llamacpp_offline["smol-beta"]
    assert running.texts() == baseline

    control_model(server.grpc_url, "load", LLAMACPP)  # a reload: a new engine from the files
    assert ask(server, "smol-epsilon", LLAMACPP) == llamacpp_offline["smol-beta"]
    assert listed_adapters(openai)["smol-epsilon"] == LLAMACPP

    unload = {"lora_name": "smol-epsilon"}
    assert post(openai, "unload_lora_adapter", unload).status_code == 200
    assert set(repository_adapters(server, LLAMACPP)) == {"smol-alpha", "smol-beta"}
    body = {"text_input": PROMPT, "lora_name": "smol-epsilon"}
    error = generate(server.http_url, LLAMACPP, body)
    assert "unknown LoRA adapter 'smol-epsilon'" in error["error"]
    # Adapters both models serve are listed as <model>/<adapter>, and a load names its model.
    listed = listed_adapters(openai)
    assert listed[f"{LLAMACPP}/smol-alpha"] == LLAMACPP and listed[f"{MODEL}/smol-alpha"] == MODEL
    no_model = {"lora_name": "smol-zeta", "lora_path": beta}
    assert error_of(post(openai, "load_lora_adapter", no_model))[:2] == (400, "base_model_name")
