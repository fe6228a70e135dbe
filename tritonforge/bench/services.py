"""The servers a run measures, started and stopped by the runner itself.

A service is a process group the runner owns: tritonserver with the contract's Triton
models (and, for ``openai`` targets, this project's OpenAI frontend in front of it),
vLLM's own OpenAI-compatible server, or llama.cpp's (llama-cpp-python's server) as the
references. Both bind 127.0.0.1
on free ports (never 8000-8002, where a developer's server may run) and are stopped
with their whole process group, so a run leaves nothing behind.

A reference server reads the *same* model.json the Triton model reads (one source
of truth for engine settings): its keys are the engine's arguments, turned into
command-line flags here.

llama.cpp's reference is llama-cpp-python's server, not upstream's ``llama-server``:
it runs the very llama.cpp build (llama-cpp-python 0.3.16) that ``llamacpp_model``
runs, so a difference between the two is the serving path's, not two llama.cpp
versions'; and it installs with one small pinned package (starlette-context) into the
serving venv, where upstream's binary comes from no registry package here except one
that compiles all of llama.cpp again. What it cannot match is ``n_parallel``: that
server decodes one request at a time (its slots are one), which is part of what
choosing it means and is recorded with its results.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import requests

from tritonforge.bench.aiperf_driver import HttpEndpoint
from tritonforge.bench.contract import Sampling, Target, TargetKind
from tritonforge.engines.base import CHAT_TEMPLATE_KEY
from tritonforge.engines.config import expand_env, resolve_path
from tritonforge.engines.host_settings import HostSettings, for_this_host
from tritonforge.launch.launcher import (
    REPO_ROOT,
    OpenAIFrontend,
    TritonServer,
    free_port,
    server_environment,
    stop_session,
    wait_until_ready,
)

READY_TIMEOUT_S = 600.0


class Service(Protocol):
    """A started server the runner can point a load tool at."""

    def start(self) -> None: ...
    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None: ...
    def stop(self) -> None: ...
    def endpoint(self, target: Target, served_model: str, sampling: Sampling) -> HttpEndpoint: ...
    def metrics_text(self) -> str | None: ...


def load_engine_settings(path: Path, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The engine arguments of a model.json, with environment variables expanded.

    An unset variable is a ValueError naming it, as when the Triton model reads the file.
    """
    env = env if env is not None else server_environment()
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or "model" not in data:
        raise ValueError(f"{path}: expected a JSON object of vLLM engine arguments with 'model'")
    settings = {
        key: expand_env(value, env) if isinstance(value, str) else value
        for key, value in data.items()
    }
    if isinstance(settings.get(CHAT_TEMPLATE_KEY), str):
        # vLLM's server takes the model's own template too (--chat-template), so both
        # servers render a chat alike; relative to the model.json, as the model reads it.
        settings[CHAT_TEMPLATE_KEY] = resolve_path(settings[CHAT_TEMPLATE_KEY], path.parent, env)
    return settings


def engine_cli_flags(settings: Mapping[str, Any]) -> list[str]:
    """vLLM engine arguments as ``api_server`` flags (``max_model_len`` → ``--max-model-len``)."""
    flags: list[str] = []
    for key, value in settings.items():
        if key == "model":
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value)]
        elif isinstance(value, list):
            flags += [flag, *map(str, value)]
        elif value is not None:
            flags += [flag, str(value)]
    return flags


def llamacpp_server_flags(settings: Mapping[str, Any]) -> list[str]:
    """llamacpp_model's model.json as llama-cpp-python server flags.

    The keys the server takes are passed as they are (``n_ctx`` → ``--n_ctx``). The
    adapter's own keys (``n_parallel``, ``kv_unified``, ``batch_invariant``) have no
    flag there, and ``chat_template`` neither: that server reads the GGUF's template.
    """
    from tritonforge.engines.llamacpp import ADAPTER_KEYS

    flags = ["--model", str(settings["model_path"])]
    for key, value in settings.items():
        if key in ("model_path", CHAT_TEMPLATE_KEY) or key in ADAPTER_KEYS:
            continue
        flags += [f"--{key}", str(value)]
    return flags


def end_of_generation_ids(model_dir: Path) -> list[int]:
    """The tokens that end a generation (``<|endoftext|>``, ``<|im_end|>``, the config's eos).

    Why: llama-cpp-python's server has no ``ignore_eos``; a logit bias of -100 on these
    tokens keeps it generating to ``max_tokens``, so every target does equal work.
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = {tokenizer.token_to_id(t) for t in ("<|endoftext|>", "<|im_end|>", "</s>")}
    config = json.loads((model_dir / "config.json").read_text())
    eos = config.get("eos_token_id")
    ids.update(eos if isinstance(eos, list) else [eos])
    return sorted(i for i in ids if isinstance(i, int))


def triton_payload_template(sampling: Sampling) -> str:
    """The aiperf payload template for a vllm_backend-style model's generate_stream.

    Inputs go by name; sampling goes as the ``sampling_parameters`` JSON string, with
    ``max_tokens`` rendered per request from the trace line.
    """
    fixed = json.dumps(
        {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "ignore_eos": sampling.ignore_eos,
        }
    )[1:-1]
    return (
        '{"text_input": {{ text|tojson }}, "stream": true, "exclude_input_in_output": true, '
        '"return_num_output_tokens": true, '
        '"sampling_parameters": {{ (\'{"max_tokens": \' ~ max_tokens ~ \', '
        + fixed
        + "}')|tojson }}}"
    )


def openai_sampling(sampling: Sampling) -> dict[str, object]:
    """The contract's sampling as OpenAI body fields (``ignore_eos`` is vLLM's extra)."""
    return {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "ignore_eos": sampling.ignore_eos,
    }


@dataclass
class TritonService:
    """tritonserver with the Triton models the contract's targets name.

    With ``openai`` the OpenAI frontend (``python -m tritonforge.openai``) runs beside it
    on a free port, pointed at this server's gRPC port, as ``make serve`` runs it.
    """

    models: Sequence[str]
    log_path: Path
    openai: bool = False
    server: TritonServer = field(init=False)
    frontend: OpenAIFrontend | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.server = TritonServer.on_free_ports(models=list(self.models), log_path=self.log_path)
        if self.openai:
            self.frontend = OpenAIFrontend.on_free_port(
                self.server.grpc_url, log_path=self.log_path.with_name("openai-frontend.log")
            )

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        missing = [m for m in self.models if not (self.server.repository / m).is_dir()]
        if missing:
            raise RuntimeError(f"model_repository/ has no model {', '.join(missing)}")
        self.server.start()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        try:
            self.server.wait_ready(timeout_s)
        except (RuntimeError, TimeoutError) as error:
            raise RuntimeError(f"{error}; log tail:\n{_tail(self.log_path)}") from None
        if self.frontend is not None:
            self.frontend.start()
            try:
                self.frontend.wait_ready()
            except (RuntimeError, TimeoutError) as error:
                log = self.frontend.log_path or self.log_path
                raise RuntimeError(f"{error}; log tail:\n{_tail(log)}") from None

    def stop(self) -> None:
        if self.frontend is not None:
            self.frontend.stop()
        self.server.stop()

    def endpoint(self, target: Target, served_model: str, sampling: Sampling) -> HttpEndpoint:
        if target.kind is TargetKind.OPENAI:
            if self.frontend is None:
                raise RuntimeError("an openai target needs the service started with openai=True")
            return HttpEndpoint(
                url=self.frontend.base_url.removesuffix("/v1"),
                model=str(target.model),
                endpoint_type="chat" if target.chat else "completions",
                extra_inputs=openai_sampling(sampling),
            )
        return HttpEndpoint(
            url=f"http://{self.server.http_url}",
            model=str(target.model),
            endpoint_type="template",
            path=f"/v2/models/{target.model}/generate_stream",
            payload_template=triton_payload_template(sampling),
            response_field="text_output",
            count_field="num_output_tokens",
        )

    def metrics_text(self) -> str | None:
        with contextlib.suppress(requests.RequestException):
            return requests.get(self.server.metrics_url, timeout=5).text
        return None


@dataclass
class PeerServer(ABC):
    """An engine's own OpenAI-compatible server, started as its users start it: one
    process group of its own (the engine's workers go with it), its log beside the run's."""

    label: ClassVar[str] = "server"

    engine_config: Path
    served_model: str
    log_path: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = field(default=None, init=False)

    @abstractmethod
    def command(self) -> list[str]:
        """The server's command line."""

    def environment(self) -> dict[str, str]:
        """The server's environment: the project's, as tritonserver gets it."""
        return server_environment()

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        command = self.command()
        with self.log_path.open("ab") as log:
            log.write(("$ " + " ".join(command) + "\n").encode())
        self.process = subprocess.Popen(
            command,
            env=self.environment(),
            stdout=self.log_path.open("ab"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # own process group: the engine core goes with it
            cwd=REPO_ROOT,
        )

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        wait_until_ready(
            self.process,
            f"http://127.0.0.1:{self.port}/v1/models",
            self.label,
            timeout_s,
            on_exit=lambda: f"; log tail:\n{_tail(self.log_path)}",
        )

    def stop(self) -> None:
        if self.process is not None:
            stop_session(self.process, signal_group=True)


@dataclass
class VllmOpenAIService(PeerServer):
    """vLLM's OpenAI-compatible server on the engine settings of a model.json."""

    label: ClassVar[str] = "vLLM server"

    def host_settings(self) -> HostSettings:
        """model.json resolved for this host, as the Triton model's adapter resolves it."""
        import torch

        settings = load_engine_settings(self.engine_config)
        return for_this_host(settings, cpu=not torch.cuda.is_available())

    def command(self) -> list[str]:
        settings = self.host_settings().engine
        return [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(settings["model"]),
            "--served-model-name",
            self.served_model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--disable-uvicorn-access-log",
            *engine_cli_flags(settings),
        ]

    def environment(self) -> dict[str, str]:
        return {**server_environment(), **self.host_settings().env}

    def endpoint(self, target: Target, served_model: str, sampling: Sampling) -> HttpEndpoint:
        # Completions unless the target says chat: the prompt then reaches the engine as
        # is, token for token the same as Triton's text_input (a chat template adds
        # tokens, so every target of a comparison must agree on it).
        return HttpEndpoint(
            url=f"http://127.0.0.1:{self.port}",
            model=served_model,
            endpoint_type="chat" if target.chat else "completions",
            extra_inputs=openai_sampling(sampling),
        )

    def metrics_text(self) -> str | None:
        with contextlib.suppress(requests.RequestException):
            return requests.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text
        return None


@dataclass
class LlamaCppServerService(PeerServer):
    """llama-cpp-python's OpenAI-compatible server on llamacpp_model's model.json."""

    label: ClassVar[str] = "llama.cpp server"

    def settings(self) -> dict[str, Any]:
        settings = load_engine_settings_any(self.engine_config)
        settings["model_path"] = resolve_path(
            settings["model_path"], self.engine_config.parent, server_environment()
        )
        return settings

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "llama_cpp.server",
            *llamacpp_server_flags(self.settings()),
            # Its default stops a streaming request whenever another arrives (the newest
            # wins); a server for concurrent clients queues them, first come first served.
            "--interrupt_requests",
            "False",
            "--model_alias",
            self.served_model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]

    def endpoint(self, target: Target, served_model: str, sampling: Sampling) -> HttpEndpoint:
        extra: dict[str, object] = {"temperature": sampling.temperature, "top_p": sampling.top_p}
        if sampling.ignore_eos:
            model_dir = Path(str(self.settings()["model_path"])).parent
            extra["logit_bias"] = {str(i): -100 for i in end_of_generation_ids(model_dir)}
        return HttpEndpoint(
            url=f"http://127.0.0.1:{self.port}",
            model=served_model,
            endpoint_type="chat" if target.chat else "completions",
            extra_inputs=extra,
        )

    def metrics_text(self) -> str | None:
        return None  # the server has no metrics endpoint


def load_engine_settings_any(path: Path) -> dict[str, Any]:
    """A model.json's keys with environment variables expanded, whatever the engine."""
    env = server_environment()
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of engine settings")
    return {k: expand_env(v, env) if isinstance(v, str) else v for k, v in data.items()}


def service_for(kind: TargetKind, targets: Sequence[Target], log_dir: Path, served: str) -> Service:
    """One service for a group of targets of the same kind (Triton serves them all at once)."""
    if kind in (TargetKind.TRITON, TargetKind.OPENAI):
        models = sorted({str(t.model) for t in targets})
        return TritonService(
            models=models,
            log_path=log_dir / "tritonserver.log",
            openai=any(t.kind is TargetKind.OPENAI for t in targets),
        )
    if kind is TargetKind.VLLM_OPENAI:
        (target,) = targets
        return VllmOpenAIService(
            engine_config=REPO_ROOT / str(target.engine_config),
            served_model=served,
            log_path=log_dir / f"{target.name}.log",
        )
    if kind is TargetKind.LLAMACPP_SERVER:
        (target,) = targets
        return LlamaCppServerService(
            engine_config=REPO_ROOT / str(target.engine_config),
            served_model=served,
            log_path=log_dir / f"{target.name}.log",
        )
    raise ValueError(f"{kind} is not served over HTTP")


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"
