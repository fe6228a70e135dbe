"""vLLM engine settings that fit the host, resolved once at load.

Why: vLLM's own defaults do not fit every host. Its ``dtype: auto`` takes the model's
bfloat16 even where the CPU has no bfloat16 instructions (AVX2 only), where bfloat16
matmuls are several times slower than float32; its ``auto`` OpenMP binding follows NUMA
nodes and SMT siblings, not the cores the server process was given.
So the adapter resolves, from the CPU's flags, ``model.json`` and the environment:

- ``dtype``: ``auto`` becomes ``float32`` on a CPU without AVX512-BF16 and AMX-BF16;
  elsewhere (such CPUs, GPUs) ``auto`` stays vLLM's choice. An explicit dtype wins.
- OpenMP binding (``VLLM_CPU_OMP_THREADS_BIND``, read by vLLM when it starts its worker):
  every core this process may run on (its affinity). Measured on a quiet 2-core host this
  beats leaving a core to EngineCore's polling: EngineCore yields its core to the
  worker's threads, so the step is shorter and batches are faster. An explicit
  environment variable wins, then ``cpu_omp_threads_bind`` in ``model.json``
  (``"all-but-one"`` for a machine whose other work would hold a core the worker waits for).
- ``enforce_eager``: true on CPU (a compiled graph starts 4-10x slower for steps at most
  about a quarter faster, and a model that starts fast comes back fast after a restart);
  left to vLLM elsewhere. An explicit value wins.

:func:`resolve_host_settings` is pure (host facts in, settings and reasons out) so each
rule is unit-tested; :func:`read_host` gathers the facts. Each choice comes with one log
line saying what was chosen and why. ``python -m tritonforge.engines.host_settings``
prints the dtype override ``make test-numerics`` uses: the one this host does not serve.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: CPU flags that give vLLM fast bfloat16 matmuls (oneDNN); without both, float32 is faster.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
#: The model.json key for the OpenMP binding (tritonforge's; vLLM reads only the variable).
BIND_KEY = "cpu_omp_threads_bind"
BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
#: vLLM's legacy CPU KV-cache size variable, and the model.json key that should win over it.
KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"
KV_BYTES_KEY = "kv_cache_memory_bytes"
#: The binding value that leaves the last usable core to other work (shared machines).
ALL_BUT_ONE = "all-but-one"


@dataclass(frozen=True)
class Host:
    """What the settings depend on: vLLM's platform, the CPU's flags, the usable cores."""

    cpu: bool  # vLLM runs on the CPU platform (no GPU)
    flags: frozenset[str] = frozenset()
    cores: tuple[int, ...] = ()  # CPUs this process may run on (its affinity)


@dataclass(frozen=True)
class HostSettings:
    """Engine arguments to build vLLM with, variables to set (or clear) first, and why."""

    engine: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()
    unset: tuple[str, ...] = ()

    def apply(self, environ: MutableMapping[str, str]) -> None:
        """Set and clear the variables vLLM reads when it starts (``environ``: the stub's
        own ``os.environ``, which serves this one model)."""
        environ.update(self.env)
        for name in self.unset:
            environ.pop(name, None)


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The first processor's flags in ``/proc/cpuinfo`` text (empty if none are listed)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def read_host(cpu: bool, cpuinfo: Path = Path("/proc/cpuinfo")) -> Host:
    """This machine's facts; a host without ``/proc/cpuinfo`` has no flags to read."""
    try:
        flags = cpu_flags(cpuinfo.read_text())
    except OSError:
        flags = frozenset()
    return Host(cpu=cpu, flags=flags, cores=tuple(sorted(os.sched_getaffinity(0))))


def cpu_list(cores: tuple[int, ...]) -> str:
    """Cores as vLLM's list syntax, runs folded: (0, 1, 2, 5) → ``"0-2,5"``."""
    runs: list[list[int]] = []
    for core in sorted(cores):
        if runs and core == runs[-1][1] + 1:
            runs[-1][1] = core
        else:
            runs.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _dtype(settings: Mapping[str, Any], host: Host) -> tuple[str, str]:
    value = settings.get("dtype", "auto")
    if value != "auto":
        return value, "set in model.json"
    if not host.cpu:
        return "auto", "not a CPU: vLLM's auto (the model's own dtype)"
    present = sorted(host.flags.intersection(BF16_FLAGS))
    if present:
        return "auto", f"CPU has {'/'.join(present)}: vLLM's auto (the model's own dtype)"
    return "float32", (
        "auto on a CPU without avx512_bf16/amx_bf16, where bfloat16 matmuls are "
        "several times slower than float32"
    )


def _binding(settings: Mapping[str, Any], host: Host, env: Mapping[str, str]) -> tuple[str, str]:
    """The binding to set ("" for none) and why."""
    if BIND_ENV in env:
        return "", "set in the environment"
    if BIND_KEY in settings:
        value = settings[BIND_KEY]
        if not isinstance(value, str) or not value:
            raise ValueError(
                f"model.json: {BIND_KEY} must be a non-empty string such as "
                f'"all", "all-but-one", "0-3", "auto" or "nobind"; got {value!r}'
            )
        if value == "all" and host.cores:
            return cpu_list(host.cores), f"{BIND_KEY} all in model.json: every core it may use"
        if value == ALL_BUT_ONE and host.cores:
            spared = host.cores[:-1] or host.cores
            return cpu_list(spared), f"{BIND_KEY} {ALL_BUT_ONE} in model.json"
        return value, f"{BIND_KEY} set in model.json"
    if not host.cpu or not host.cores:
        return "", "not a CPU: no OpenMP binding"
    return cpu_list(host.cores), (
        f"every core this process may use ({len(host.cores)}): EngineCore yields its core "
        "to the worker while it waits, and a step on all cores is the shortest"
    )


def _eager(settings: Mapping[str, Any], host: Host) -> tuple[bool | None, str]:
    if "enforce_eager" in settings:
        return bool(settings["enforce_eager"]), "set in model.json"
    if host.cpu:
        return True, "CPU: a compiled graph starts 4-10x slower for steps at most ~25 % faster"
    return None, "not a CPU: vLLM's default (compiled graphs)"


def resolve_host_settings(
    settings: Mapping[str, Any], host: Host, env: Mapping[str, str]
) -> HostSettings:
    """model.json's settings resolved for ``host``; ``env`` is the process environment."""
    engine = {k: v for k, v in settings.items() if k != BIND_KEY}
    dtype, dtype_why = _dtype(settings, host)
    engine["dtype"] = dtype
    bind, bind_why = _binding(settings, host, env)
    eager, eager_why = _eager(settings, host)
    if eager is not None:
        engine["enforce_eager"] = eager
    shown_bind = bind or env.get(BIND_ENV, "vLLM's default")
    reasons: tuple[str, ...] = (
        f"engine setting dtype={dtype}: {dtype_why}",
        f"engine setting {BIND_ENV}={shown_bind}: {bind_why}",
        f"engine setting enforce_eager={'vLLM default' if eager is None else eager}: {eager_why}",
    )
    unset: tuple[str, ...] = ()
    if host.cpu and KV_BYTES_KEY in settings and KV_SPACE_ENV in env:
        # On CPU vLLM lets the variable (the launcher's default for every model) replace
        # the model's own kv_cache_memory_bytes; the model's explicit size must win.
        unset = (KV_SPACE_ENV,)
        reasons += (f"engine setting {KV_SPACE_ENV} cleared: {KV_BYTES_KEY} set in model.json",)
    return HostSettings(
        engine=engine, env={BIND_ENV: bind} if bind else {}, reasons=reasons, unset=unset
    )


def for_this_host(settings: Mapping[str, Any], cpu: bool) -> HostSettings:
    """:func:`resolve_host_settings` on this machine and this process's environment.

    The adapter and every offline reference that must run exactly as the server does
    (tests, benchmarks) call this, so they resolve the same way.
    """
    return resolve_host_settings(settings, read_host(cpu), os.environ)


def other_dtype(settings: Mapping[str, Any], host: Host) -> str:
    """The dtype this host does *not* serve ``settings`` with: ``make test-numerics`` runs
    the model-text tests again under it, so both numerics stay tested on every host.

    ``auto`` left to vLLM means the model's own 16-bit dtype (the shipped checkpoint is
    bfloat16), so its other one is float32; float32's other one is bfloat16.
    """
    dtype = resolve_host_settings(settings, host, {}).engine["dtype"]
    return "bfloat16" if dtype in ("float32", "float") else "float32"


def main() -> None:
    """Print the JSON override ``make test-numerics`` serves vllm_model with on this host."""
    import torch  # vLLM's platform is the CPU unless CUDA is there

    from tritonforge.paths import REPO_ROOT

    path = REPO_ROOT / "model_repository/vllm_model/1/model.json"
    host = read_host(cpu=not torch.cuda.is_available())
    print(json.dumps({"dtype": other_dtype(json.loads(path.read_text()), host)}))


if __name__ == "__main__":
    main()
