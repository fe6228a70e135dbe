"""Small client helpers for end-to-end tests: real tritonclient gRPC/HTTP, no mocks."""

from __future__ import annotations

import contextlib
import json
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tritonforge.engines.base import CHAT_TEMPLATE_KEY
from tritonforge.engines.config import load_engine_config, resolve_paths
from tritonforge.engines.lora import LoraAdapter, load_adapters
from tritonforge.launch.launcher import OpenAIFrontend, TritonServer, server_environment


def bytes_input(name: str, value: str | bytes) -> grpcclient.InferInput:
    raw = value.encode() if isinstance(value, str) else value
    tensor = grpcclient.InferInput(name, [1], "BYTES")
    tensor.set_data_from_numpy(np.array([raw], dtype=np.object_))
    return tensor


def bool_input(name: str, value: bool) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [1], "BOOL")
    tensor.set_data_from_numpy(np.array([value], dtype=bool))
    return tensor


def llm_inputs(
    prompt: str | None = None,
    sampling: dict | None = None,
    *,
    messages: list[dict] | None = None,
    stream: bool = True,
    **flags: bool,
) -> list[grpcclient.InferInput]:
    inputs = []
    if prompt is not None:
        inputs.append(bytes_input("text_input", prompt))
    if messages is not None:
        inputs.append(bytes_input("messages", json.dumps(messages)))
    if sampling is not None:
        inputs.append(bytes_input("sampling_parameters", json.dumps(sampling)))
    inputs.append(bool_input("stream", stream))
    if not stream:
        flags.setdefault("exclude_input_in_output", True)
    inputs += [bool_input(name, value) for name, value in flags.items()]
    return inputs


@dataclass
class StreamResult:
    responses: list[Any] = field(default_factory=list)
    error: Exception | None = None

    def texts(self, name: str = "text_output") -> list[str]:
        """One string per response that carries ``name`` (a BYTES output)."""
        return [
            b"".join(r.as_numpy(name).reshape(-1)).decode()
            for r in self.responses
            if r.as_numpy(name) is not None
        ]

    @property
    def text(self) -> str:
        return "".join(self.texts())

    def outputs(self, name: str) -> list[Any]:
        return [r.as_numpy(name) for r in self.responses if r.as_numpy(name) is not None]


def _is_final(result: Any) -> bool:
    params = result.get_response().parameters
    return "triton_final_response" in params and params["triton_final_response"].bool_param


def stream(
    url: str,
    model: str,
    inputs: list[grpcclient.InferInput],
    *,
    stop_after: int | None = None,
    timeout_s: float = 120.0,
    on_response: Callable[[int], None] | None = None,
    request_timeout_us: int | None = None,
) -> StreamResult:
    """One request over a gRPC stream; ``stop_after`` N responses cancels it.

    ``request_timeout_us`` is Triton's own request ``timeout`` parameter (microseconds).
    """
    events: queue.Queue = queue.Queue()
    result = StreamResult()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    ended = False  # the request's last response (or its error) arrived
    try:
        client.async_stream_infer(
            model, inputs, enable_empty_final_response=True, timeout=request_timeout_us
        )
        deadline = time.monotonic() + timeout_s
        while True:
            res, err = events.get(timeout=max(0.1, deadline - time.monotonic()))
            if err is not None:
                result.error = err
                ended = True
                break
            if res.get_response().outputs:
                result.responses.append(res)
                if on_response:
                    on_response(len(result.responses))
            if _is_final(res):
                ended = True
                break
            if stop_after is not None and len(result.responses) >= stop_after:
                break  # the finally block cancels it
    finally:
        # After an error response tritonclient marks the stream invalid and stop_stream
        # raises; the error itself is already in ``result``.
        # Cancel only a request that is still running: cancelling one that has ended
        # races Triton 2.51's own clean-up of it (see the engine-restart test).
        with contextlib.suppress(InferenceServerException):
            client.stop_stream(cancel_requests=not ended)
        client.close()
    return result


def control_model(grpc_url: str, action: str, model: str) -> None:
    """Load or unload over gRPC.

    Not over HTTP: a stub started while an HTTP connection is open inherits its socket
    (Triton 2.51), and at shutdown Triton then waits out its whole exit timeout for
    that connection to close. Triton 2.51 workaround W10, see docs/triton-2.51-workarounds.md.
    """
    with grpcclient.InferenceServerClient(grpc_url) as client:
        getattr(client, f"{action}_model")(model)


def generate(http_url: str, model: str, body: dict, timeout_s: float = 300) -> dict:
    """POST /generate; returns the JSON body (``{"error": ...}`` on a request error)."""
    reply = requests.post(
        f"http://{http_url}/v2/models/{model}/generate", json=body, timeout=timeout_s
    )
    return reply.json()


def generate_stream_text(http_url: str, model: str, body: dict) -> str:
    """POST /generate_stream and join the SSE events' text_output."""
    with requests.post(
        f"http://{http_url}/v2/models/{model}/generate_stream", json=body, stream=True, timeout=300
    ) as reply:
        parts = []
        for line in reply.iter_lines(decode_unicode=False):
            if line.startswith(b"data: "):
                event = json.loads(line[6:])
                assert "error" not in event, event
                parts.append(event.get("text_output", ""))
        return "".join(parts)


def _string_characters(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_string_characters(v) for v in value.values())
    if isinstance(value, list):
        return sum(_string_characters(v) for v in value)
    return 0


def compact_json_budget(longest: Any) -> int:
    """A ``max_tokens`` that always lets a compact JSON answer close, given the longest
    answer its schema allows (longest strings, widest numbers): every token carries at
    least one character, a string's characters may each come as a six-character escape,
    and one more token ends the answer. A ``length`` finish within it is never the
    model's choice."""
    text = json.dumps(longest, separators=(", ", ": "))
    return len(text) + 5 * _string_characters(longest) + 1


#: Greedy sampling for a request that outlasts any test that cancels, times out or queues it.
LONG_GREEDY = {"temperature": 0, "max_tokens": 1500, "ignore_eos": True}


class Hold:
    """A streamed request that runs until the test cancels it (``LONG_GREEDY`` outlasts
    any test), on a gRPC stream of its own.

    Tests that need requests to overlap, fill an engine's slots or queue behind others
    make them do so by construction with holds, and wait on what a hold observed (its
    first response, a count of responses) instead of guessing how fast the engine is.
    """

    def __init__(
        self,
        grpc_url: str,
        model: str,
        prompt: str | None = None,
        sampling: dict | None = None,
        on_first: Callable[[], None] | None = None,
        inputs: list[grpcclient.InferInput] | None = None,
    ) -> None:
        """``inputs``, when given, are sent as they are (``prompt``/``sampling`` unused)."""
        self._changed = threading.Condition()
        self.times: list[float] = []  # time.monotonic() of each response
        self.error: Exception | None = None
        self.ended = False  # its final response (or an error) arrived
        self._on_first = on_first
        self._client = grpcclient.InferenceServerClient(grpc_url)
        self._client.start_stream(callback=self._received)
        if inputs is None:
            inputs = llm_inputs(prompt, sampling=LONG_GREEDY if sampling is None else sampling)
        self._client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        self.open = True

    def _received(self, result: Any, error: Exception | None) -> None:
        with self._changed:
            if error is not None:
                self.error, self.ended = error, True
            else:
                if result.get_response().outputs:
                    self.times.append(time.monotonic())
                    if len(self.times) == 1 and self._on_first is not None:
                        self._on_first()
                self.ended = self.ended or _is_final(result)
            self._changed.notify_all()

    @property
    def responses(self) -> int:
        return len(self.times)

    def wait_responses(self, count: int = 1, timeout_s: float = 120.0) -> None:
        """Wait until ``count`` responses arrived; fail on an error or an early end."""
        with self._changed:
            self._changed.wait_for(lambda: self.responses >= count or self.ended, timeout=timeout_s)
            assert self.error is None, self.error
            assert self.responses >= count, (
                f"{self.responses} of {count} responses in {timeout_s:.0f} s "
                f"({'ended' if self.ended else 'still open'})"
            )

    def wait_end(self, timeout_s: float = 120.0) -> None:
        """Wait until the request ended (its final response or an error arrived)."""
        with self._changed:
            assert self._changed.wait_for(lambda: self.ended, timeout=timeout_s), (
                f"still open after {timeout_s:.0f} s"
            )

    def cancel(self) -> None:
        """Cancel the request (if it still runs) and close the stream."""
        if self.open:
            self.open = False
            with contextlib.suppress(InferenceServerException):
                self._client.stop_stream(cancel_requests=not self.ended)
            self._client.close()

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\} (\S+)$")


def metric(metrics_url: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus series' samples whose labels include ``labels``."""
    total = 0.0
    for line in requests.get(metrics_url, timeout=10).text.splitlines():
        match = _SAMPLE.match(line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match.group(3))
    return total


def requests_running(metrics_url: str, prefix: str, model: str) -> float:
    """A model's running-requests gauge; ``prefix`` is its engine's metric family."""
    return metric(metrics_url, f"{prefix}:num_requests_running", model=model)


def requests_cancelled(metrics_url: str, prefix: str, model: str) -> float:
    """How many of a model's requests have ended cancelled."""
    return metric(metrics_url, f"{prefix}:request_outcome_total", model=model, outcome="cancelled")


def model_state(http_url: str, model: str) -> str:
    """A model's state in the repository index ("READY", "UNLOADING", …; "" if unknown)."""
    index = requests.post(f"http://{http_url}/v2/repository/index", timeout=10).json()
    return next((m.get("state", "") for m in index if m["name"] == model), "")


def wait_for(
    predicate: Callable[[], bool], timeout_s: float = 60.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@contextmanager
def openai_frontend(server: TritonServer, log_path: Path) -> Iterator[OpenAIFrontend]:
    """This project's OpenAI frontend in front of ``server`` on a free port, ready; told
    where the server's metrics are (its ports are free ones, not the defaults)."""
    service = OpenAIFrontend.on_free_port(
        server.grpc_url,
        log_path=log_path,
        extra_args=[f"--triton-metrics={server.metrics_url}"],
    )
    service.start()
    try:
        service.wait_ready()
        yield service
    finally:
        service.stop()


def own_server_frontend(label: str) -> Any:
    """A module-scoped fixture: the OpenAI frontend in front of the module's own ``server``.

    A module whose models run on a server of their own (OWN_SERVER_MODELS) binds it to
    the name its tests ask for (``openai = own_server_frontend("lora")``). Pytest resolves
    ``server`` in that module, so the frontend starts after the module's server and stops
    before it, as a fixture written out in the module would; its log lands in a
    ``<label>-openai`` temporary directory.
    """

    @pytest.fixture(scope="module")
    def frontend(
        server: TritonServer, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[OpenAIFrontend]:
        log = tmp_path_factory.mktemp(f"{label}-openai") / "openai.log"
        with openai_frontend(server, log) as service:
            yield service

    return frontend


def served_engine_settings(
    version_dir: Path, keys: tuple[str, ...]
) -> tuple[dict, tuple[LoraAdapter, ...], dict]:
    """A model's engine settings (``keys`` resolved to paths) and LoRA adapters, resolved
    as its server resolves them, and the server's environment: what an offline reference
    run must use."""
    env = server_environment()
    config = load_engine_config(version_dir, "model.json")
    # The chat template is the engine core's (it renders chats for every engine), not an
    # engine argument: an offline engine renders with its tokenizer's, which the shipped
    # templates equal for plain chats (tests/unit/serving/test_chat.py).
    config.pop(CHAT_TEMPLATE_KEY, None)
    with pytest.MonkeyPatch.context() as patch:
        for name in ("TRITONFORGE_MODELS", "TRITONFORGE_GGUF"):
            if name in env:
                patch.setenv(name, env[name])
        return resolve_paths(config, version_dir, keys=keys), load_adapters(version_dir), env


def run_reference(
    script: Path, source: str, args: list[Any], env: dict[str, str], timeout_s: float
) -> Any:
    """Run an offline reference ``source`` (an engine used directly) in its own process.

    The script receives ``args`` JSON-encoded, one per argv item, and prints its result
    as one line ``RESULT<json>``; everything else it prints (engine logs) is ignored. A
    process of its own keeps the engine's memory and threads out of the test process.
    """
    script.write_text(source)
    done = subprocess.run(
        [sys.executable, str(script), *map(json.dumps, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert lines, done.stderr[-3000:]
    return json.loads(lines[0][len("RESULT") :])


def model_ready(server: Any, model: str) -> bool:
    """Whether ``model`` is loaded and ready on ``server`` (False if it cannot be asked)."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        return client.is_model_ready(model)
    except Exception:
        return False
    finally:
        client.close()
