"""What the repository tool needs to know about each engine, in one table.

The engine adapters (``tritonforge/engines``) import their engine at module level, and
importing vLLM takes tens of seconds, so the generator does not import them to learn
a file name: the table below repeats the few facts it needs, and a unit test holds it
to the adapters' own ``ConfigFile`` where that import is cheap.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tritonforge.engines.host_settings import BIND_KEY


@dataclass(frozen=True)
class KnownArgs:
    """The engine arguments the installed engine accepts, and where that list came from."""

    names: frozenset[str]
    source: str  # "vLLM 0.32.0 AsyncEngineArgs", for messages


@dataclass(frozen=True)
class EngineSpec:
    key: str  # the --engine value
    label: str  # how users call it
    backend: str  # config.pbtxt backend: the folder under backends/
    config_file: str  # model.json / model.yaml in the version directory
    model_key: str  # the engine argument naming the model
    path_keys: tuple[str, ...]  # arguments that are paths ($VAR, relative to the version dir)
    model_kind: str  # "hf" (a HuggingFace directory), "gguf" (a file) or "tokenizer" (a directory)
    module: str  # what requires.txt names: the launcher skips the model where it is missing
    max_inflight: int  # the shipped model's bound
    defaults: dict[str, Any] = field(default_factory=dict)  # written unless overridden
    #: Extra keys the configuration file may hold besides engine arguments.
    file_keys: frozenset[str] = frozenset()


ENGINES: dict[str, EngineSpec] = {
    spec.key: spec
    for spec in (
        EngineSpec(
            key="vllm",
            label="vLLM",
            backend="vllm",
            config_file="model.json",
            model_key="model",
            path_keys=("model", "tokenizer"),
            model_kind="hf",
            module="vllm",
            max_inflight=256,
        ),
        EngineSpec(
            key="llamacpp",
            label="llama.cpp",
            backend="llamacpp",
            config_file="model.json",
            model_key="model_path",
            path_keys=("model_path",),
            model_kind="gguf",
            module="llama_cpp",
            # n_parallel sequences decode together; as many again may wait, then "busy".
            max_inflight=16,
            defaults={"n_parallel": 8},
        ),
        EngineSpec(
            key="tensorrt_llm",
            label="TensorRT-LLM",
            backend="tensorrtllm",
            config_file="model.yaml",
            model_key="model",
            path_keys=("model", "tokenizer"),
            model_kind="hf",
            module="tensorrt_llm",
            max_inflight=256,
            # Upstream llmapi format: the PyTorch backend, and the Triton section this
            # project requires (streaming, in-flight batching).
            defaults={
                "backend": "pytorch",
                "triton_config": {"decoupled": True, "max_batch_size": 0},
            },
            file_keys=frozenset({"triton_config"}),
        ),
        EngineSpec(
            key="synthetic",
            label="synthetic",
            backend="synthetic",
            config_file="model.json",
            model_key="tokenizer",
            path_keys=("tokenizer",),
            model_kind="tokenizer",
            module="transformers",
            max_inflight=1024,
        ),
    )
}

#: config.pbtxt backend → engine key (for reading a repository).
BY_BACKEND = {spec.backend: spec for spec in ENGINES.values()}


def is_installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _vllm_args() -> KnownArgs:
    arg_utils = importlib.import_module("vllm.engine.arg_utils")
    vllm = importlib.import_module("vllm")
    fields = dataclasses.fields(arg_utils.AsyncEngineArgs)
    version = getattr(vllm, "__version__", "?")
    # Plus the one key this project's adapter reads itself (engines/host_settings.py).
    names = frozenset(f.name for f in fields) | {BIND_KEY}
    return KnownArgs(names, f"vLLM {version} AsyncEngineArgs")


def _llamacpp_args() -> KnownArgs:
    llama_cpp = importlib.import_module("llama_cpp")
    # Llama(**kwargs) swallows unknown keywords; only the named parameters do anything.
    parameters = inspect.signature(llama_cpp.Llama.__init__).parameters.values()
    names = frozenset(
        p.name
        for p in parameters
        if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    )
    version = getattr(llama_cpp, "__version__", "?")
    # Plus the keys this project's adapter reads itself (n_parallel, kv_unified).
    adapter = importlib.import_module("tritonforge.engines.llamacpp")
    return KnownArgs(names | adapter.ADAPTER_KEYS, f"llama-cpp-python {version} Llama()")


def _tensorrt_llm_args() -> KnownArgs:
    llm_args = importlib.import_module("tensorrt_llm.llmapi.llm_args")
    trtllm = importlib.import_module("tensorrt_llm")
    # LLM(**kwargs) with backend="pytorch" validates its keywords as TorchLlmArgs.
    names = frozenset(llm_args.TorchLlmArgs.model_fields)
    version = getattr(trtllm, "__version__", "?")
    return KnownArgs(names, f"TensorRT-LLM {version} TorchLlmArgs")


def _synthetic_args() -> KnownArgs:
    synthetic = importlib.import_module("tritonforge.engines.synthetic")
    return KnownArgs(
        frozenset(synthetic.SyntheticSettings.model_fields), "synthetic engine settings"
    )


_PROVIDERS: dict[str, Callable[[], KnownArgs]] = {
    "vllm": _vllm_args,
    "llamacpp": _llamacpp_args,
    "tensorrt_llm": _tensorrt_llm_args,
    "synthetic": _synthetic_args,
}


@functools.cache
def known_args(engine: str) -> KnownArgs | str:
    """The installed engine's argument names, or why they cannot be known here.

    Imports the engine (vLLM: tens of seconds on two cores), once per process.
    """
    spec = ENGINES[engine]
    if not is_installed(spec.module):
        return f"{spec.label} is not installed here"
    try:
        return _PROVIDERS[engine]()
    except Exception as exc:  # an engine that fails to import is reported, not fatal
        return f"{spec.label} could not be imported ({type(exc).__name__}: {exc})"
