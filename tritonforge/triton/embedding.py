"""The Triton edge of an embedding model: a plain request → response batch.

Unlike the LLM models (decoupled streams, batched inside the engine), an embedding
model is non-decoupled with Triton's dynamic batcher in front: Triton gathers requests
that arrive together, and :meth:`EmbeddingModel.execute` embeds every prompt of every
request of the batch in ONE engine call (:meth:`Embedder.embed`), then answers each
request with its rows. A request that breaks a rule (no prompt, empty, too long, bad
UTF-8, token id out of range) gets its own INVALID_ARG naming the input and the row,
checked before the engine call, so it never fails the requests batched with it.

A backend's ``model.py`` is two lines: ``make_embedding_model("package.module:Embedder")``;
the embedder is imported when the model loads, never in the auto-complete stub (model.py
beside this says why).
"""

from __future__ import annotations

import json
import pkgutil
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonforge.engines.config import load_engine_config
from tritonforge.engines.embedding import Embedded, Embedder
from tritonforge.heap import freeze_startup_heap
from tritonforge.serving.errors import RequestError
from tritonforge.triton.model import triton_error
from tritonforge.triton.reaper import start_reaper

#: An embedding model's tensors (batched: Triton puts the batch dimension in front), added
#: in auto-complete. One prompt per batch row: a text, or a row of token ids.
EMBEDDING_INPUTS: tuple[dict[str, Any], ...] = (
    {"name": "text_input", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
    {"name": "input_ids", "data_type": "TYPE_INT32", "dims": [-1], "optional": True},
)
EMBEDDING_OUTPUTS: tuple[dict[str, Any], ...] = (
    {"name": "embedding", "data_type": "TYPE_FP32", "dims": [-1]},
    {"name": "num_input_tokens", "data_type": "TYPE_UINT32", "dims": [1]},
)


def _field(name: str, row: int, rows: int) -> str:
    """The input a rule names: ``text_input``, or ``text_input[2]`` in a batch of rows."""
    return name if rows == 1 else f"{name}[{row}]"


def _text(value: Any, field: str) -> str:
    raw = value if isinstance(value, bytes) else str(value).encode()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(
            field, f"is not valid UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None


class EmbeddingModel:
    """Base of every embedding ``TritonPythonModel``; subclasses set ``engine_name``."""

    #: ``"package.module:Class"`` of the embedder, imported by :meth:`initialize` only.
    engine_name: str

    @classmethod
    def auto_complete_config(cls, config: Any) -> Any:
        present = config.as_dict()
        have_inputs = {i["name"] for i in present.get("input", [])}
        have_outputs = {o["name"] for o in present.get("output", [])}
        for spec in EMBEDDING_INPUTS:
            if spec["name"] not in have_inputs:
                config.add_input(spec)
        for spec in EMBEDDING_OUTPUTS:
            if spec["name"] not in have_outputs:
                config.add_output(spec)
        return config

    def initialize(self, args: dict[str, str]) -> None:
        model_config = json.loads(args["model_config"])
        if pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise ValueError(
                f"{args['model_name']}: an embedding model answers each request once; "
                "remove model_transaction_policy { decoupled: true } from config.pbtxt"
            )
        if int(model_config.get("max_batch_size", 0)) < 1:
            raise ValueError(
                f"{args['model_name']}: set max_batch_size >= 1 and dynamic_batching in "
                "config.pbtxt; the model embeds a whole batch in one engine call"
            )
        version_dir = Path(args["model_repository"]) / args["model_version"]
        engine_class: type[Embedder] = pkgutil.resolve_name(self.engine_name)
        settings = load_engine_config(version_dir, engine_class.config_file.name)
        self.engine = engine_class.from_config(settings, version_dir)
        # Whatever ends this stub, its engine's processes end with it (reaper.py).
        self._reaper = start_reaper()
        self.engine.start()
        freeze_startup_heap()  # no full GC pass walks the engine's objects again (heap.py)

    def _prompts(self, request: Any) -> list[tuple[int, ...]]:
        """The request's rows as checked token ids (RequestError names the input)."""
        text = pb_utils.get_input_tensor_by_name(request, "text_input")
        ids = pb_utils.get_input_tensor_by_name(request, "input_ids")
        if (text is None) == (ids is None):
            raise RequestError("text_input", "send exactly one of text_input and input_ids")
        if text is not None:
            values = text.as_numpy().reshape(-1)
            return [
                self.engine.prepare_text(_text(v, f), f)
                for i, v in enumerate(values)
                for f in [_field("text_input", i, len(values))]
            ]
        rows = ids.as_numpy()
        rows = rows.reshape(1, -1) if rows.ndim == 1 else rows
        return [
            self.engine.prepare_ids(row.tolist(), _field("input_ids", i, len(rows)))
            for i, row in enumerate(rows)
        ]

    @staticmethod
    def _response(rows: list[Embedded]) -> Any:
        vectors = np.stack([row.vector for row in rows]).astype(np.float32, copy=False)
        counts = np.array([[row.prompt_tokens] for row in rows], dtype=np.uint32)
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("embedding", vectors),
                pb_utils.Tensor("num_input_tokens", counts),
            ]
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        parsed: list[list[tuple[int, ...]] | RequestError] = []
        for request in requests:
            try:
                parsed.append(self._prompts(request))
            except RequestError as exc:
                parsed.append(exc)
        batch = [p for item in parsed if isinstance(item, list) for p in item]
        failure: Exception | None = None
        embedded: list[Embedded] = []
        try:
            embedded = self.engine.embed(batch) if batch else []
        except Exception as exc:
            pb_utils.Logger.log_error(f"[tritonforge] embedding failed: {exc!r}")
            failure = exc
        responses, at = [], 0
        for item in parsed:
            error = item if isinstance(item, RequestError) else failure
            if error is not None:
                responses.append(pb_utils.InferenceResponse(error=triton_error(error)))
                continue
            assert isinstance(item, list)
            responses.append(self._response(embedded[at : at + len(item)]))
            at += len(item)
        return responses

    def finalize(self) -> None:
        self.engine.shutdown()


def make_embedding_model(engine_name: str) -> type[EmbeddingModel]:
    """The ``TritonPythonModel`` class for one embedding engine (``"package.module:Class"``)."""
    return type("TritonPythonModel", (EmbeddingModel,), {"engine_name": engine_name})
