"""The OpenAI frontend's LoRA routes without a server: which model a load goes to, how
adapters are listed and named, and vLLM's status codes. The models' answers to control
requests are played by :class:`Models` (the real ones are tests/e2e/test_lora.py's)."""

from __future__ import annotations

import asyncio

import pytest

from tritonforge.openai.adapters import (
    AdapterCatalogue,
    LoadLoRAAdapterRequest,
    Served,
    UnloadLoRAAdapterRequest,
    control_error,
)
from tritonforge.openai.errors import OpenAIError, from_triton
from tritonforge.openai.responses import ModelList, to_json


class Models(AdapterCatalogue):
    """Each model's adapters as its control requests would report them."""

    def __init__(self, served: dict[str, Served]) -> None:
        super().__init__(gateway=None)  # type: ignore[arg-type]  # never reached
        self.models = served
        self.sent: list[tuple[str, str, str]] = []

    async def control(self, model: str, action: str, name: str = "", path: str = "") -> Served:
        self.sent.append((model, action, name))
        served = self.models[model]
        if action == "load":
            served = Served({**served.adapters, name: path}, served.loads_adapters)
        elif action == "unload":
            served = Served({k: v for k, v in served.adapters.items() if k != name}, True)
        self.models[model] = served
        self._served[model] = served
        return served

    async def refresh(self) -> dict[str, Served]:
        self._served = dict(self.models)
        return dict(self._served)


def two_models() -> Models:
    return Models(
        {
            "vllm_lora": Served({"alpha": "/a", "beta": "/b"}, True),
            "llama_lora": Served({"alpha": "/a"}, True),
            "plain": Served({}, False),
        }
    )


def failure(work: object) -> OpenAIError:
    with pytest.raises(OpenAIError) as info:
        asyncio.run(work)  # type: ignore[arg-type]
    return info.value


def test_adapters_are_listed_with_their_parent_by_bare_name_unless_shared() -> None:
    models = two_models()
    cards = asyncio.run(models.cards(created=1))
    assert {(c.id, c.parent, c.root) for c in cards} == {
        ("beta", "vllm_lora", "/b"),
        ("vllm_lora/alpha", "vllm_lora", "/a"),
        ("llama_lora/alpha", "llama_lora", "/a"),
    }
    # vLLM's card shape: parent and root on adapters, absent on models.
    listing = ModelList(object="list", data=cards)
    assert b'"parent":"vllm_lora"' in to_json(listing)


def test_a_model_name_routes_to_its_model_and_adapter() -> None:
    models = two_models()
    assert asyncio.run(models.resolve("beta")) == ("vllm_lora", "beta")
    assert asyncio.run(models.resolve("llama_lora/alpha")) == ("llama_lora", "alpha")
    assert asyncio.run(models.resolve("alpha")) is None  # two models serve it: name one
    assert asyncio.run(models.resolve("gamma")) is None


def test_a_load_goes_to_the_named_model_or_the_only_one_that_loads() -> None:
    models = two_models()
    body = LoadLoRAAdapterRequest(lora_name="gamma", lora_path="/g")
    error = failure(models.load(body))
    assert (error.status, error.param) == (400, "base_model_name")
    assert "2 models load adapters at run time: llama_lora, vllm_lora" in error.message
    body.base_model_name = "llama_lora"
    answer = asyncio.run(models.load(body))
    assert answer == "Success: LoRA adapter 'gamma' added successfully."
    assert models.sent[-1] == ("llama_lora", "load", "gamma")
    assert asyncio.run(models.resolve("gamma")) == ("llama_lora", "gamma")

    del models.models["vllm_lora"]  # one loader left: no need to name it
    asyncio.run(models.load(LoadLoRAAdapterRequest(lora_name="delta", lora_path="/d")))
    assert models.sent[-1] == ("llama_lora", "load", "delta")


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"lora_path": "/g"}, 400, "lora_name"),
        ({"lora_name": "g"}, 400, "lora_path"),
        ({"lora_name": "plain", "lora_path": "/g"}, 400, "lora_name"),  # a model's name
        ({"lora_name": "g", "lora_path": "/g", "load_inplace": True}, 400, "load_inplace"),
        ({"lora_name": "g", "lora_path": "/g", "base_model_name": "nope"}, 404, "base_model_name"),
    ],
)
def test_a_bad_load_is_named(body: dict, status: int, param: str) -> None:
    error = failure(two_models().load(LoadLoRAAdapterRequest(**body)))
    assert (error.status, error.param) == (status, param)


def test_unload_finds_the_model_and_names_what_it_cannot() -> None:
    models = two_models()
    answer = asyncio.run(models.unload(UnloadLoRAAdapterRequest(lora_name="beta")))
    assert answer == "Success: LoRA adapter 'beta' removed successfully."
    assert models.sent[-1] == ("vllm_lora", "unload", "beta")
    error = failure(models.unload(UnloadLoRAAdapterRequest(lora_name="beta")))
    assert (error.status, error.param, error.message) == (
        404,
        "lora_name",
        "The lora adapter 'beta' cannot be found.",
    )
    error = failure(models.unload(UnloadLoRAAdapterRequest(lora_name="alpha")))
    assert (error.status, error.param) == (400, "base_model_name")
    body = UnloadLoRAAdapterRequest(lora_name="alpha", base_model_name="llama_lora")
    asyncio.run(models.unload(body))
    assert models.sent[-1] == ("llama_lora", "unload", "alpha")


@pytest.mark.parametrize(
    ("message", "status", "param"),
    [
        ("lora_name: unknown LoRA adapter 'g'; available: a", 404, "lora_name"),
        ("lora_path: no LoRA adapter at /x (no such directory)", 404, "lora_path"),
        ("lora_name: LoRA adapter 'a' is already loaded (from /a)", 400, "lora_name"),
        ("lora_path: adapter 'w' has rank 16, above max_lora_rank 8", 400, "lora_path"),
        ("lora_control: the llm engine does not load LoRA adapters", 400, "lora_control"),
    ],
)
def test_model_errors_keep_vllms_status_codes(message: str, status: int, param: str) -> None:
    error = control_error(from_triton(message, "m"))
    assert (error.status, error.param) == (status, param)


def test_a_request_naming_an_adapter_goes_to_its_model_and_a_gone_one_is_a_404() -> None:
    """The body's model is the adapter; the model gets its lora_name. An adapter another
    client unloaded meanwhile is a 404 for that model name, as vLLM answers it."""
    from tests.unit.openai.test_openai_translate import FakeGateway, client, deltas

    gone = from_triton("lora_name: unknown LoRA adapter 'beta'; available: none", "llm")
    gateway = FakeGateway(deltas(), [gone])
    with client(gateway) as test_client:
        test_client.app.state.server.adapters._served = {"llm": Served({"beta": "/b"}, True)}
        body = {"model": "beta", "prompt": "x", "max_tokens": 2}
        answer = test_client.post("/v1/completions", json=body)
        assert answer.status_code == 200 and answer.json()["model"] == "beta"
        assert gateway.sent[-1]["lora_name"] == "beta"
        error = test_client.post("/v1/completions", json=body)
        assert error.status_code == 404 and error.json()["error"]["param"] == "model"
        assert test_client.app.state.server.adapters.known("beta") is None
