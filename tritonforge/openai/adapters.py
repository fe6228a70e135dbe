"""LoRA adapters over the OpenAI API, as vLLM's server offers them.

``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path"}`` and ``POST
/v1/unload_lora_adapter`` ``{"lora_name"}`` take vLLM's bodies and answer as it does
(200 with ``Success: …`` text; 400 for a bad or taken name, 404 for an adapter or a
path that is not there). Each becomes a control request to the model
(:mod:`tritonforge.serving.lora_control`: the ``lora_control`` input), which adds the
adapter to the running engine and to the model's ``multi_lora.json``.

A Triton server may serve several models, where vLLM serves one: a load names its
model with ``base_model_name`` (the key vLLM's ``--lora-modules`` uses) unless exactly
one model loads adapters at run time. ``/v1/models`` lists every adapter with its
``parent`` (the model) and ``root`` (its directory); a request names an adapter as its
``model``, by its name when one model serves that name, or as ``<model>/<adapter>``
(always accepted, and how an adapter served by two models is listed).

What each model serves is asked of the models (``lora_control: list``), never guessed:
the catalogue is read again for ``/v1/models``, for a name it does not know, and after
every load or unload, so adapters loaded by plain Triton clients show up too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from tritonforge.engines.lora import NO_ADAPTER_AT, UNKNOWN_ADAPTER
from tritonforge.openai.errors import OpenAIError, from_triton, invalid
from tritonforge.openai.responses import ModelCard
from tritonforge.openai.translate import TritonRequest
from tritonforge.openai.triton_client import TritonGateway, TritonStream, _bytes

CONTROL_INPUT = "lora_control"


class LoadLoRAAdapterRequest(BaseModel):
    """vLLM's body, plus ``base_model_name`` to pick the model."""

    model_config = ConfigDict(extra="allow")
    lora_name: str = ""
    lora_path: str = ""
    load_inplace: bool = False
    base_model_name: str | None = None


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    lora_name: str = ""
    lora_int_id: int | None = None
    base_model_name: str | None = None


@dataclass(frozen=True)
class Served:
    """What one model says it serves."""

    adapters: dict[str, str]  # name -> directory
    loads_adapters: bool


def not_found(message: str, param: str) -> OpenAIError:
    return OpenAIError(404, message, "NotFoundError", param, "not_found")


class AdapterCatalogue:
    """The adapters of every model on one Triton server, and their control requests."""

    def __init__(self, gateway: TritonGateway) -> None:
        self.gateway = gateway
        self._served: dict[str, Served] = {}

    async def control(self, model: str, action: str, name: str = "", path: str = "") -> Served:
        """Send one control request to ``model``; what it serves afterwards."""
        inputs = [_bytes(CONTROL_INPUT, action)]
        inputs += [_bytes("lora_name", name)] if name else []
        inputs += [_bytes("lora_path", path)] if path else []

        async def one_request() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": model, "inputs": inputs}

        call = self.gateway.client.stream_infer(one_request())
        stream = TritonStream(call, model, self.gateway.url, self.gateway.forget)
        try:
            output = await anext(stream, None)
        except OpenAIError as error:
            raise control_error(error) from None
        finally:
            stream.cancel()
        if output is None:
            raise from_triton("the model ended the control request without an answer", model)
        answer = json.loads(output.text)
        served = Served(dict(answer["adapters"]), bool(answer["loads_adapters"]))
        self._served[model] = served
        return served

    async def refresh(self) -> dict[str, Served]:
        """Ask every LLM model that takes control requests what it serves.

        A model that cannot answer (unloading, failed) is left out of the catalogue
        rather than failing the listing of every other model.
        """
        models = []
        for name in await self.gateway.served_models():
            spec = await self.gateway.spec(name, "any")
            if spec.is_llm and CONTROL_INPUT in spec.inputs:
                models.append(name)
        answers = await asyncio.gather(
            *(self.control(m, "list") for m in models), return_exceptions=True
        )
        self._served = {m: a for m, a in zip(models, answers, strict=True) if isinstance(a, Served)}
        return dict(self._served)

    def _ids(self) -> dict[str, tuple[str, str]]:
        """Listed id -> (model, adapter): bare names where one model serves the name."""
        owners: dict[str, list[str]] = {}
        for model, served in self._served.items():
            for name in served.adapters:
                owners.setdefault(name, []).append(model)
        ids = {}
        for name, models in owners.items():
            for model in models:
                ids[name if len(models) == 1 else f"{model}/{name}"] = (model, name)
        return ids

    async def cards(self, created: int) -> list[ModelCard]:
        """``/v1/models`` entries of the adapters, each with its parent model."""
        await self.refresh()
        return [
            ModelCard(
                id=listed,
                object="model",
                created=created,
                owned_by="tritonforge",
                parent=model,
                root=self._served[model].adapters[name],
            )
            for listed, (model, name) in sorted(self._ids().items())
        ]

    def known(self, requested: str) -> tuple[str, str] | None:
        """(model, adapter) a request's ``model`` names, as last read (no round trip)."""
        found = self._ids().get(requested)
        model, _, name = requested.partition("/")
        served = self._served.get(model)
        if found is None and served is not None and name in served.adapters:
            found = (model, name)
        return found

    async def resolve(self, requested: str) -> tuple[str, str] | None:
        """(model, adapter) a request's ``model`` names, read again if it is not known;
        None if it names no adapter."""
        if (found := self.known(requested)) is not None:
            return found
        await self.refresh()
        return self.known(requested)

    def unloaded(self, error: OpenAIError, model: str, request: TritonRequest) -> OpenAIError:
        """``error``, or a 404 for the request's ``model`` when it named an adapter its
        model no longer serves (unloaded by another client); the catalogue is read again
        for the next request naming it."""
        if request.triton_model is None or UNKNOWN_ADAPTER not in error.message:
            return error
        self._served.pop(model, None)
        adapter = request.sampling.get("lora_name")
        return not_found(f"The model `{adapter}` does not exist ({model} unloaded it).", "model")

    async def load(self, body: LoadLoRAAdapterRequest) -> str:
        """vLLM's ``/v1/load_lora_adapter``: the adapter on its model's running engine."""
        if not body.lora_name or not body.lora_path:
            missing = "lora_name" if not body.lora_name else "lora_path"
            raise invalid("Both 'lora_name' and 'lora_path' must be provided.", missing)
        if body.load_inplace:
            raise invalid(
                "load_inplace: not supported; unload the adapter, then load it again",
                "load_inplace",
            )
        served = await self.refresh()
        if body.lora_name in served:
            raise invalid(
                f"The lora adapter '{body.lora_name}' conflicts with a served base model.",
                "lora_name",
            )
        model = self._base_model(body.base_model_name, served)
        await self.control(model, "load", body.lora_name, body.lora_path)
        return f"Success: LoRA adapter '{body.lora_name}' added successfully."

    def _base_model(self, named: str | None, served: dict[str, Served]) -> str:
        loaders = sorted(m for m, s in served.items() if s.loads_adapters)
        if named is not None:
            if named not in served:
                raise not_found(
                    f"base_model_name: `{named}` is not a loaded LLM model", "base_model_name"
                )
            return named
        if len(loaders) == 1:
            return loaders[0]
        which = ", ".join(loaders) if loaders else "none"
        raise invalid(
            f"base_model_name: name the model to load the adapter into ({len(loaders)} "
            f"models load adapters at run time: {which})",
            "base_model_name",
        )

    async def unload(self, body: UnloadLoRAAdapterRequest) -> str:
        """vLLM's ``/v1/unload_lora_adapter``: new requests can no longer name it."""
        if not body.lora_name:
            raise invalid("'lora_name' needs to be provided to unload a LoRA adapter.", "lora_name")
        served = await self.refresh()
        owners = [m for m, s in served.items() if body.lora_name in s.adapters]
        if body.base_model_name is not None:
            owners = [m for m in owners if m == body.base_model_name]
        if not owners:
            raise not_found(f"The lora adapter '{body.lora_name}' cannot be found.", "lora_name")
        if len(owners) > 1:
            raise invalid(
                f"base_model_name: adapter '{body.lora_name}' is served by {', '.join(owners)}; "
                "name the model to unload it from",
                "base_model_name",
            )
        await self.control(owners[0], "unload", body.lora_name)
        return f"Success: LoRA adapter '{body.lora_name}' removed successfully."


def control_error(error: OpenAIError) -> OpenAIError:
    """What is not there is a 404, as vLLM answers it; the rest as the model words it."""
    if UNKNOWN_ADAPTER in error.message:
        return not_found(error.message, "lora_name")
    if NO_ADAPTER_AT in error.message:
        return not_found(error.message, "lora_path")
    return error
