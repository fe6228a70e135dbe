"""The served targets' servers, all up at once for a run and all stopped after it.

The rounds interleave the targets, so every server must be up together: one
tritonserver for every Triton (and OpenAI-frontend) target, one own server per
reference target (vLLM's, llama.cpp's). They start side by side; each one's start-up
time is until it answered ready. A server that fails to start fails its targets, not the run.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tritonforge.bench.contract import Target, TargetKind
from tritonforge.bench.environment import tritonserver_version
from tritonforge.bench.results import TargetResult
from tritonforge.bench.services import Service, TritonService, service_for

if TYPE_CHECKING:
    from tritonforge.bench.runner import Runner


@dataclass
class Servers:
    """The servers that came up: by target name, with each target's start-up seconds."""

    services: dict[str, Service] = field(default_factory=dict)
    startup_s: dict[str, float] = field(default_factory=dict)
    tritonserver: str = "not started in this run"  # the running server's own version

    def stop(self) -> None:
        """Stop each server once (one Triton serves several targets)."""
        for service in {id(s): s for s in self.services.values()}.values():
            service.stop()


def server_groups(targets: Iterable[Target]) -> list[tuple[TargetKind, list[Target]]]:
    """One Triton for every target it serves, then one own server per reference target."""
    targets = list(targets)
    on_triton = [t for t in targets if t.kind in (TargetKind.TRITON, TargetKind.OPENAI)]
    groups = [(TargetKind.TRITON, on_triton)] if on_triton else []
    own = (TargetKind.VLLM_OPENAI, TargetKind.LLAMACPP_SERVER)
    groups += [(t.kind, [t]) for t in targets if t.kind in own]
    return groups


def start_servers(runner: Runner, results: dict[str, TargetResult]) -> Servers:
    """Start every served target's server at once; a failure fails its targets in ``results``."""
    contract = runner.plan.contract
    logs = runner.plan.run_dir / "logs"
    pending: list[tuple[Service, list[Target], float]] = []
    for kind, targets in server_groups(contract.targets):
        label = ", ".join(t.name for t in targets)
        try:
            service = service_for(kind, targets, logs, served=contract.model)
            runner.step(f"starting {kind.value} for {label}")
            service.start()
        except (OSError, ValueError, RuntimeError) as error:
            for t in targets:
                results[t.name] = runner.failed(t, f"server did not start: {error}")
            continue
        pending.append((service, targets, time.monotonic()))
    servers = Servers()
    for service, targets, began in pending:
        _await_ready(runner, servers, service, targets, began, results)
    return servers


def _await_ready(
    runner: Runner,
    servers: Servers,
    service: Service,
    targets: list[Target],
    began: float,
    results: dict[str, TargetResult],
) -> None:
    label = ", ".join(t.name for t in targets)
    try:
        service.wait_ready()
    except (OSError, ValueError, RuntimeError, TimeoutError) as error:
        service.stop()
        runner.say(f"[red]✗ {label}: server did not start[/]")
        for t in targets:
            results[t.name] = runner.failed(t, f"server did not start: {error}")
        return
    # Servers start side by side; each one's time is until it answered ready.
    startup_s = time.monotonic() - began
    runner.say(f"ready in {startup_s:.0f} s: {label}")
    if isinstance(service, TritonService):
        servers.tritonserver = tritonserver_version(service.server.http_url)
    for t in targets:
        servers.services[t.name], servers.startup_s[t.name] = service, startup_s
