"""Run the real ``tritonserver`` (from the nvidia-pytriton wheel) on this project's models.

The wheel carries a complete Triton 2.51 server, its python backend and a stub per
Python version, but not laid out the way ``--backend-directory`` expects. This
module assembles that layout under the clone's cache folder (symlinks, rebuilt on
every start), adds this project's backends, sets the environment the stub needs
(venv first on PATH, the interpreter's own libpython, a UTF-8 locale) and runs the
server bound to 127.0.0.1. Stopping it stops the whole process group — the stubs
and the engine processes they spawn — so nothing is left running. ``main`` (``make
serve``) also runs the OpenAI-compatible API (:mod:`tritonforge.openai`) beside it, on
the same bind address, restarts a server that dies unexpectedly
(:mod:`tritonforge.launch.supervisor`), and on SIGTERM or Ctrl-C drains both at once
within one grace period (:func:`_serve`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Container, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import requests

from tritonforge.launch.stream_probe import PROBE_MODEL, STREAMS_STALLED, StreamProbe
from tritonforge.launch.supervisor import RestartPolicy, Supervisor, remove_files, shm_regions
from tritonforge.openai.shutdown import DEFAULT_SHUTDOWN_GRACE_S
from tritonforge.paths import CACHE_DIR, MODEL_REPOSITORY, REPO_ROOT

BACKENDS_SRC = REPO_ROOT / "backends"
STOP_TIMEOUT_S = 60.0
#: Seconds a stopped process may take past its own grace period before it is killed.
KILL_AFTER_S = 30.0
#: Seconds of the grace period the OpenAI frontend leaves to tritonserver: it ends its
#: own streams still running that much earlier, with their error event, while Triton
#: still answers, and Triton then has the time to unload its models.
FRONTEND_LEAD_S = 5.0

#: A gRPC call's ``traceparent`` metadata, copied exactly into a request parameter: Triton
#: 2.51 reads the metadata past its end and can lose it; the model's runtime then keeps its
#: spans under the client's span from this copy. Triton 2.51 workaround W18, see
#: docs/triton-2.51-workarounds.md.
TRACEPARENT_FORWARD = "--grpc-header-forward-pattern=^traceparent$"


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"{name} is not installed in {sys.prefix} (run `make serve` once)")
    return Path(next(iter(spec.submodule_search_locations)))


def triton_home() -> Path:
    """``pytriton/tritonserver`` inside the venv: bin/, backends/python, stubs, caches."""
    return _package_dir("pytriton") / "tritonserver"


def triton_libs() -> Path:
    return _package_dir("pytriton").parent / "nvidia_pytriton.libs"


def assemble_backend_dir(target: Path) -> Path:
    """Lay out ``<target>/python`` (python backend + stub) and one folder per own backend.

    A Python-based backend is a folder holding ``model.py``; a C++ backend is a
    folder holding ``libtriton_<name>.so`` built under ``build/backends``.
    """
    if target.exists():
        shutil.rmtree(target)
    python_dir = target / "python"
    python_dir.mkdir(parents=True)
    home = triton_home()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = home / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise RuntimeError(f"the Triton wheel ships no stub for Python {version}: {stub}")
    for source in (
        home / "backends" / "python" / "libtriton_python.so",
        home / "backends" / "python" / "triton_python_backend_utils.py",
        stub,
    ):
        shutil.copy2(source, python_dir / source.name)
    for backend in sorted(BACKENDS_SRC.iterdir()):
        if (backend / "model.py").is_file():
            (target / backend.name).mkdir()
            shutil.copy2(backend / "model.py", target / backend.name / "model.py")
    built = REPO_ROOT / "build" / "backends"
    if built.is_dir():
        for library in built.glob("*/libtriton_*.so"):
            (target / library.parent.name).mkdir(exist_ok=True)
            shutil.copy2(library, target / library.parent.name / library.name)
    return target


def server_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the server, its stubs and their engines need (each setting says why)."""
    env = dict(base if base is not None else os.environ)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH", "")])
    # The stub links libpython3.11: it must be this interpreter's, not Debian's older
    # one, or the standard library's C modules fail with undefined symbols.
    lib_dirs = [sysconfig.get_config_var("LIBDIR") or "", str(triton_libs())]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [d for d in lib_dirs if d] + [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
    )
    # The stub's interpreter runs isolated with an ASCII locale unless told otherwise.
    # Triton 2.51 workaround W6, see docs/triton-2.51-workarounds.md.
    env.setdefault("LANG", "C.UTF-8")
    env.setdefault("LC_ALL", "C.UTF-8")
    env.setdefault("TRITONFORGE_MODELS", str(CACHE_DIR / "models"))
    if "TRITONFORGE_GGUF" not in env:  # llamacpp_model's model.json names $TRITONFORGE_GGUF
        from tritonforge.launch.model_store import gguf_path

        with contextlib.suppress(FileNotFoundError):
            env["TRITONFORGE_GGUF"] = str(gguf_path())
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    return env


#: A ``requires.txt`` entry that is not a module: the model needs an NVIDIA GPU.
NEEDS_NVIDIA_GPU = "nvidia-gpu"


@functools.cache
def nvidia_gpu() -> bool:
    """Whether an NVIDIA GPU answers ``nvidia-smi`` (as scripts/bootstrap.sh decides)."""
    smi = shutil.which("nvidia-smi")
    return (
        smi is not None and subprocess.run([smi], capture_output=True, check=False).returncode == 0
    )


def _present(requirement: str) -> bool:
    if requirement == NEEDS_NVIDIA_GPU:
        return nvidia_gpu()
    return importlib.util.find_spec(requirement) is not None


def available_models(repository: Path = MODEL_REPOSITORY) -> list[str]:
    """Models in the repository whose engine can run on this machine.

    A model may name in ``requires.txt`` beside its config the Python modules it needs
    (TensorRT-LLM on a machine without it, for example) and ``nvidia-gpu`` when it is
    configured for an NVIDIA GPU (``vllm_model_gpu``); such models are left out of the
    default start-up rather than failing the whole server.
    """
    names = []
    for config in sorted(repository.glob("*/config.pbtxt")):
        needs = config.parent / "requires.txt"
        requirements = needs.read_text().split() if needs.is_file() else []
        if all(_present(r) for r in requirements):
            names.append(config.parent.name)
    return names


def terminated_with_parent(command: Sequence[str]) -> list[str]:
    """``command`` made to get SIGTERM if the launcher dies, even by SIGKILL.

    util-linux's ``setpriv --pdeathsig`` sets it and execs the command (same process), so
    Popen needs no ``preexec_fn``: with one it must fork() rather than vfork(), and a
    fork while another thread of the launcher is inside gRPC (the supervisor's polls, the
    stream probe) runs gRPC's fork handlers, which then skip their work — the child was
    seen to abort before its exec ("epoll_wait error: Bad file descriptor"), which a
    vfork never did in the same reproduction. Without setpriv the command runs as is.
    """
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--", *command] if setpriv else list(command)


#: Ports picked here come from [PORT_FLOOR, the OS's ephemeral range) (see free_port).
PORT_FLOOR = 10000
_handed_out: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The ports the OS hands to ``bind(0)`` and outgoing connections (Linux's setting)."""
    with contextlib.suppress(OSError, ValueError):
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    return 32768, 60999  # Linux's default


def free_port() -> int:
    """A port free now, below the ephemeral range, not handed out before by this process.

    Not the OS's ``bind(0)`` pick: tritonserver binds its ports only after loading its
    models, a minute later, and meanwhile any process may be given the same port by the
    OS — a run lost its Triton that way to vLLM's server starting beside it ("Socket
    '127.0.0.1:…' already in use"). The OS never hands out ports below its ephemeral
    range, so there only an explicit bind can collide, and a bound port fails the check.
    """
    low, _ = ephemeral_range()
    if low - PORT_FLOOR < 1000:  # an unusual range: let the OS choose, as before
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
    rng = random.SystemRandom()
    for _ in range(1000):
        port = rng.randrange(PORT_FLOOR, low)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use (or lingering): try another
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port found in {PORT_FLOOR}-{low - 1}")


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports (free_port never hands out one twice)."""
    return sorted(free_port() for _ in range(count))


def session_processes(leader_pid: int) -> list[psutil.Process]:
    """Every live process in the session a ``start_new_session`` child leads."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getsid(proc.pid) == leader_pid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def stop_session(
    process: subprocess.Popen, timeout_s: float = STOP_TIMEOUT_S, *, signal_group: bool = False
) -> int | None:
    """SIGTERM a session leader, wait for it, then SIGKILL whatever is left of its session.

    tritonserver takes SIGTERM alone and stops its stubs itself (they finalise their
    models); ``signal_group`` sends it to the whole process group instead, for servers
    whose workers must hear it directly (vLLM's engine core).
    """
    if signal_group or process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            if signal_group:
                os.killpg(process.pid, signal.SIGTERM)
            else:
                process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    leftovers = session_processes(process.pid)
    for proc in leftovers:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(leftovers, timeout=10)
    return process.returncode


def answers(url: str, statuses: Container[int] = (200,), timeout_s: float = 2.0) -> bool:
    """Does ``url`` answer a GET with one of ``statuses``?"""
    with contextlib.suppress(requests.RequestException):
        return requests.get(url, timeout=timeout_s).status_code in statuses
    return False


def wait_until_ready(
    process: subprocess.Popen | None,
    url: str,
    what: str,
    timeout_s: float,
    poll_s: float = 0.5,
    on_exit: Callable[[], str] = lambda: "",
    statuses: Container[int] = (200,),
) -> None:
    """Poll ``url`` until it answers with one of ``statuses``; fail at once if
    ``process`` exits first.

    ``on_exit`` adds detail (a log tail) to the error of a process that died.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode}{on_exit()}")
        if answers(url, statuses):
            return
        time.sleep(poll_s)
    raise TimeoutError(f"{what} not ready after {timeout_s:.0f} s")


@dataclass
class TritonServer:
    """One tritonserver process group: start, wait until ready, stop without leftovers."""

    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    models: Sequence[str] | None = None
    repository: Path = MODEL_REPOSITORY
    extra_args: Sequence[str] = ()
    log_path: Path | None = None
    host: str = "127.0.0.1"
    #: Set on top of this process's environment for the server and its stubs: one
    #: server's own settings (a benchmark's traced variant), beside others without them.
    env: Mapping[str, str] = field(default_factory=dict)
    #: ``--exit-timeout-secs``: on SIGTERM Triton turns unready, its models refuse new
    #: requests, and the requests in flight have this long to finish — unloading the
    #: models included — before it exits anyway (Triton 2.51's own drain).
    exit_timeout_s: int = DEFAULT_SHUTDOWN_GRACE_S
    process: subprocess.Popen | None = field(default=None, init=False)

    @classmethod
    def on_free_ports(cls, **settings: Any) -> TritonServer:
        """A server on three distinct free ports, never the 8000-8002 a developer may use."""
        http, grpc, metrics = free_ports(3)
        return cls(http_port=http, grpc_port=grpc, metrics_port=metrics, **settings)

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def command(self, backend_dir: Path) -> list[str]:
        binary = triton_home() / "bin" / "tritonserver"
        cmd = [
            str(binary),
            f"--model-repository={self.repository}",
            f"--backend-directory={backend_dir}",
            f"--cache-directory={triton_home() / 'caches'}",
            f"--http-address={self.host}",
            f"--grpc-address={self.host}",
            f"--metrics-address={self.host}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--model-control-mode=explicit",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            TRACEPARENT_FORWARD,
        ]
        models = self.models if self.models is not None else available_models(self.repository)
        cmd += [f"--load-model={name}" for name in models]
        return cmd + list(self.extra_args)

    def start(self, backend_dir: Path | None = None) -> None:
        # One backend directory per server (by HTTP port): assembling it deletes the old
        # one, and a second server (the tests' beside `make serve`, or a test's own beside
        # the session's) must not pull the stub out from under a running one.
        backend_dir = assemble_backend_dir(
            backend_dir or CACHE_DIR / "backends" / f"http-{self.http_port}"
        )
        stdout = self.log_path.open("ab") if self.log_path else None
        self.process = subprocess.Popen(
            terminated_with_parent(self.command(backend_dir)),
            env=server_environment({**os.environ, **self.env}),
            stdout=stdout,
            stderr=subprocess.STDOUT if stdout else None,
            start_new_session=True,  # its own process group: we stop stubs and engines with it
        )

    @property
    def ready_url(self) -> str:
        return f"http://{self.http_url}/v2/health/ready"

    def wait_ready(self, timeout_s: float = 600.0) -> None:
        wait_until_ready(self.process, self.ready_url, "tritonserver", timeout_s)

    def is_ready(self) -> bool:
        """Ready now (one readiness request, at most 2 s)?"""
        return self.process is not None and self.process.poll() is None and answers(self.ready_url)

    def descendants(self) -> list[psutil.Process]:
        """The server's live child processes: stubs and the engine processes they start."""
        if self.process is None or self.process.poll() is not None:
            return []
        with contextlib.suppress(psutil.Error):
            return psutil.Process(self.process.pid).children(recursive=True)
        return []

    def group_processes(self) -> list[psutil.Process]:
        """Every live process in the server's session (server, stubs, engine workers)."""
        return session_processes(self.process.pid) if self.process is not None else []

    def stop(self, timeout_s: float | None = None) -> int | None:
        """SIGTERM the server (it drains, unloads models, stubs finalise), then kill what
        remains — after ``timeout_s``, by default its exit timeout and KILL_AFTER_S — and
        remove the shared memory it mapped: a server that did not finalise its models (its
        exit timeout expired, or it was killed) leaves python backend regions behind."""
        if self.process is None:
            return None
        regions = shm_regions(self.process.pid)
        if timeout_s is None:
            timeout_s = max(STOP_TIMEOUT_S, self.exit_timeout_s + KILL_AFTER_S)
        code = stop_session(self.process, timeout_s)
        remove_files(regions)
        return code

    def __enter__(self) -> TritonServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _client_host(host: str) -> str:
    """Where a local client reaches a server bound to ``host`` (a wildcard: loopback)."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


def openai_base_url(host: str, port: int) -> str:
    """The OpenAI base URL (``…/v1``) a local client uses for a frontend bound to ``host``:
    one spelling for the frontend and for the tools that only know its port."""
    return f"http://{_client_host(host)}:{port}/v1"


def launcher_metrics_endpoint(port: int) -> str:
    """The launcher's own /metrics (served on loopback): one spelling for its ready line
    and for the tools that read it."""
    return f"http://127.0.0.1:{port}/metrics"


@dataclass
class OpenAIFrontend:
    """``python -m tritonforge.openai`` for one Triton server, as a process group of its own.

    Started beside tritonserver by ``make serve`` and by the tests; stopped the same way
    (SIGTERM, then whatever is left of its session is killed), and it dies with the
    launcher even if the launcher is SIGKILLed.
    """

    triton_grpc: str
    port: int = 9000
    host: str = "127.0.0.1"
    log_path: Path | None = None
    extra_args: Sequence[str] = ()
    #: Set on top of this process's environment (as :attr:`TritonServer.env`).
    env: Mapping[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = field(default=None, init=False)

    @classmethod
    def on_free_port(cls, triton_grpc: str, **settings: Any) -> OpenAIFrontend:
        return cls(triton_grpc=triton_grpc, port=free_port(), **settings)

    @property
    def base_url(self) -> str:
        """The OpenAI base URL clients use (``…/v1``)."""
        return openai_base_url(self.host, self.port)

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "tritonforge.openai",
            f"--triton-grpc={self.triton_grpc}",
            f"--host={self.host}",
            f"--port={self.port}",
            *self.extra_args,
        ]

    def start(self) -> None:
        stdout = self.log_path.open("ab") if self.log_path else None
        self.process = subprocess.Popen(
            terminated_with_parent(self.command()),
            env={**os.environ, **self.env},
            stdout=stdout,
            stderr=subprocess.STDOUT if stdout else None,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def health_url(self) -> str:
        return f"http://{_client_host(self.host)}:{self.port}/health"

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until it serves: up, with a model of a ready Triton to serve."""
        wait_until_ready(
            self.process, self.health_url, "the OpenAI frontend", timeout_s, poll_s=0.2
        )

    def wait_up(self, timeout_s: float = 60.0) -> None:
        """Until it answers its health check at all — 503 included, its answer while
        Triton is down or serves no LLM model: its own start-up is done, whatever
        Triton's state (the launcher watches that)."""
        wait_until_ready(
            self.process,
            self.health_url,
            "the OpenAI frontend",
            timeout_s,
            poll_s=0.2,
            statuses=(200, 503),
        )

    def begin_stop(self) -> None:
        """SIGTERM it without waiting: it refuses new connections and drains
        (tritonforge/openai/shutdown.py)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM it (again) and wait ``timeout_s`` for it, then kill what is left."""
        return stop_session(self.process, timeout_s) if self.process is not None else None


def _port(env_name: str, default: int) -> int:
    return int(os.environ.get(env_name, default))


def example_request(server: TritonServer, model: str) -> str:
    """The request the ready line suggests: it must generate something on any CPU, so the
    prompt is one a small greedy model continues (tests/e2e/test_readme_examples.py runs
    it), and only the generated text comes back (no echoed prompt)."""
    return (
        f"curl -s -X POST http://{server.http_url}/v2/models/{model}/generate "
        '-d \'{"text_input": "The three primary colours are", "exclude_input_in_output": true, '
        '"parameters": {"max_tokens": 16, "temperature": 0}}\''
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Serve model_repository/ with the real tritonserver (foreground), "
        "restarting it if it dies.",
        epilog="Arguments after -- go to tritonserver unchanged.",
    )
    parser.add_argument("--models", nargs="*", help="models to load (default: all that can run)")
    parser.add_argument(
        "--host",
        default=os.environ.get("TRITON_HOST", "127.0.0.1"),
        help="bind address of every port (default: $TRITON_HOST, else 127.0.0.1)",
    )
    parser.add_argument(
        "--no-openai",
        action="store_true",
        help="do not start the OpenAI-compatible API (port TRITONFORGE_OPENAI_PORT, 9000)",
    )
    parser.add_argument(
        "--shutdown-grace-s",
        type=int,
        default=DEFAULT_SHUTDOWN_GRACE_S,
        help="seconds requests in flight may run on after SIGTERM or Ctrl-C, while new ones "
        "are refused; tritonserver's --exit-timeout-secs. Those still running then end with "
        f"an error (default {DEFAULT_SHUTDOWN_GRACE_S})",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=RestartPolicy.max_restarts,
        help="restarts of a tritonserver that died (start-up included) per --restart-window "
        f"(default {RestartPolicy.max_restarts}; 0: never restart)",
    )
    parser.add_argument(
        "--restart-window",
        type=float,
        default=RestartPolicy.window_s,
        help=f"seconds (default {RestartPolicy.window_s:.0f})",
    )
    probe = StreamProbe()
    parser.add_argument(
        "--stream-probe-period",
        type=float,
        default=probe.period_s,
        help="seconds between two probes of a ready tritonserver's gRPC streams (one request "
        f"to {PROBE_MODEL} on a new stream; default {probe.period_s:.0f}; 0: no probe)",
    )
    parser.add_argument(
        "--stream-probe-timeout",
        type=float,
        default=probe.timeout_s,
        help=f"seconds a probe's stream may take to answer (default {probe.timeout_s:.0f})",
    )
    parser.add_argument(
        "--stream-probe-failures",
        type=int,
        default=probe.failures,
        help="probes failed in a row that restart tritonserver like a crash, counted as "
        f"cause {STREAMS_STALLED!r} (default {probe.failures}; 0: no probe)",
    )
    return parser


def _ready_line(server: TritonServer, frontend: OpenAIFrontend | None, metrics_port: int) -> str:
    models = server.models if server.models is not None else available_models()
    first = "vllm_model" if "vllm_model" in models else (models[0] if models else "")
    openai = f"OpenAI API {frontend.base_url}, " if frontend is not None else ""
    return (
        f"tritonforge ready — HTTP {server.http_url}, gRPC {server.grpc_url}, "
        f"metrics {server.metrics_url}, {openai}launcher metrics "
        f"{launcher_metrics_endpoint(metrics_port)}, models: {', '.join(models)}. "
        f"Try: {example_request(server, first)}"
    )


def _until_serving(supervisor: Supervisor, supervision: Future[int]) -> bool:
    """Wait until tritonserver is ready (True) or the supervisor has ended (False)."""
    while not supervisor.serving.wait(0.5):
        if supervision.done():
            return False
    return True


def _serve(
    supervisor: Supervisor,
    frontend: OpenAIFrontend | None,
    announce: Callable[[], None],
    grace_s: int = DEFAULT_SHUTDOWN_GRACE_S,
) -> int:
    """Supervise tritonserver from its first start, bring the frontend up beside it, and
    ``announce`` once both serve; the supervisor's outcome. Everything is stopped on the
    way out, and drained: both get SIGTERM at once, so new work is refused everywhere at
    the same moment (Triton turns unready and its models refuse new requests; the frontend
    closes its port) while the requests in flight — Triton's own clients' and the
    frontend's streams, which pass through Triton — run on within the grace period.
    The frontend ends its leftovers first, with an error event (FRONTEND_LEAD_S), then
    Triton's exit timeout (``grace_s``) ends the rest.

    The supervisor runs on a thread of its own from the start, so a server that dies at
    any stage of start-up — loading, or ready while the frontend comes up — is restarted
    like any other crash. The frontend starts once tritonserver first is ready (it has
    nothing to serve before) and must be up within its own bound, whatever Triton does
    meanwhile; the ready line waits for Triton to be ready again if it died.
    """
    pool = ThreadPoolExecutor(1, thread_name_prefix="supervisor")
    supervision = pool.submit(supervisor.run)
    try:
        if frontend is not None and _until_serving(supervisor, supervision):
            frontend.start()
            frontend.wait_up()
        if _until_serving(supervisor, supervision):
            announce()
        while True:
            with contextlib.suppress(TimeoutError):
                return supervision.result(timeout=1.0)
    finally:
        print(
            f"tritonforge: stopping: requests in flight have {grace_s} s to finish…",
            file=sys.stderr,
            flush=True,
        )
        if frontend is not None:
            frontend.begin_stop()
        supervisor.stop()  # SIGTERM to tritonserver, and wait for its drain to end
        if frontend is not None:
            frontend.stop(timeout_s=grace_s + KILL_AFTER_S)
        pool.shutdown()  # the supervisor returns once its server has ended


def main(argv: list[str] | None = None) -> int:
    """``make serve``: tritonserver under a :class:`Supervisor`, the OpenAI API beside it.

    Ctrl-C or SIGTERM stops everything (no restart); an unexpected exit of tritonserver,
    from its start on, is restarted (see tritonforge/launch/supervisor.py) while the
    OpenAI frontend keeps running and answers 503 meanwhile.
    """
    args, extra = _parser().parse_known_args(argv)
    from tritonforge.launch.model_store import ensure_default_model

    ensure_default_model()
    server = TritonServer(
        http_port=_port("TRITON_HTTP_PORT", 8000),
        grpc_port=_port("TRITON_GRPC_PORT", 8001),
        metrics_port=_port("TRITON_METRICS_PORT", 8002),
        models=args.models,
        extra_args=[a for a in extra if a != "--"],
        host=args.host,
        exit_timeout_s=args.shutdown_grace_s,
    )
    frontend = None
    if not args.no_openai:
        lead = min(FRONTEND_LEAD_S, args.shutdown_grace_s / 5)
        frontend = OpenAIFrontend(
            triton_grpc=f"{_client_host(server.host)}:{server.grpc_port}",
            port=_port("TRITONFORGE_OPENAI_PORT", 9000),
            host=server.host,
            extra_args=[f"--shutdown-grace-s={args.shutdown_grace_s - lead:g}"],
        )
    policy = RestartPolicy(max_restarts=args.max_restarts, window_s=args.restart_window)
    probe = StreamProbe(
        period_s=args.stream_probe_period,
        timeout_s=args.stream_probe_timeout,
        failures=args.stream_probe_failures,
    )
    supervisor = Supervisor(server, policy, streams=probe)
    metrics_port = _port("TRITONFORGE_LAUNCHER_METRICS_PORT", 8003)

    def _terminate(signum: int, _frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the drain
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    try:
        supervisor.metrics.serve("127.0.0.1", metrics_port)
        ready_line = _ready_line(server, frontend, metrics_port)
        announce = lambda: print(ready_line, flush=True)  # noqa: E731
        return _serve(supervisor, frontend, announce, args.shutdown_grace_s)
    except KeyboardInterrupt:
        return 0
    finally:
        supervisor.metrics.close()


if __name__ == "__main__":
    sys.exit(main())
