"""``exit-cost`` and ``exit-cost-report``: run the suite against one endpoint, and write
the pairwise report of a directory of candidates.

One file per candidate (``<out>/<candidate>.json``), so candidates served one at a time
(two cores hold one server) land in the same directory and one report covers them all.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tritonforge.bench.environment import (
    SERVING_PACKAGES,
    dirty_files,
    git_state,
    machine,
    serving_versions,
    tritonserver_version,
)
from tritonforge.bench.exit_cost import changes
from tritonforge.bench.exit_cost.checks import CHECKS, Suite, run_all
from tritonforge.bench.exit_cost.results import SuiteResult, load_dir
from tritonforge.bench.exit_cost.transport import HttpTransport, Transport
from tritonforge.paths import REPO_ROOT

RESULTS_ROOT = REPO_ROOT / "perf" / "results" / "exit-cost"


def _utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def server_root(base_url: str) -> str:
    """``http://host:port/v1`` → ``http://host:port``: where /metrics and /version live."""
    parts = urlsplit(base_url.rstrip("/"))
    path = parts.path[: -len("/v1")] if parts.path.endswith("/v1") else parts.path
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def served(t: Transport, base_url: str, model: str) -> dict[str, Any]:
    """What the endpoint says of itself: its version route (where it has one) and the
    model's card from ``/v1/models``."""
    out: dict[str, Any] = {}
    version = t.get(server_root(base_url) + "/version")
    if version.ok:
        out["server_version"] = version.body if version.body is not None else version.text[:200]
    models = t.get(base_url.rstrip("/") + "/models")
    cards = models.body.get("data", []) if models.ok and isinstance(models.body, dict) else []
    card = next((c for c in cards if c.get("id") == model), None)
    if card is not None:
        out["model_card"] = card
    return out


def environment(
    t: Transport, base_url: str, model: str, triton_http: str | None = None
) -> dict[str, Any]:
    """The machine, this tree's commit (the suite's, and tritonforge's when it is the
    candidate), the serving venv's versions, the load, and what the server reports."""
    commit, dirty = git_state()
    triton = {"tritonserver": tritonserver_version(triton_http)} if triton_http else {}
    return {
        "machine": machine().model_dump(),
        "git_commit": commit,
        "git_dirty": dirty,
        "dirty_files": dirty_files() if dirty else [],
        "serving_versions": serving_versions((*SERVING_PACKAGES, "llama-cpp-python")),
        "load_average": list(os.getloadavg()),
        **triton,
        **served(t, base_url, model),
    }


def run(args: argparse.Namespace) -> int:
    out = (
        Path(args.out)
        if args.out
        else RESULTS_ROOT / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    )
    out.mkdir(parents=True, exist_ok=True)
    transport = HttpTransport(args.base_url, api_key=os.environ.get(args.api_key_env or ""))
    suite = Suite(
        model=args.model,
        metrics_url=args.metrics_url or server_root(args.base_url) + "/metrics",
        adapter=args.adapter,
        probe_tokens=args.probe_tokens,
        samples=args.samples,
    )
    started = _utc()
    env = environment(transport, args.base_url, args.model, args.triton_http)
    checks = run_all(transport, suite, args.check)
    result = SuiteResult(
        candidate=args.candidate,
        targets=args.target,
        base_url=args.base_url,
        model=args.model,
        started_at=started,
        finished_at=_utc(),
        environment=env,
        checks=checks,
    )
    path = out / f"{args.candidate}.json"
    path.write_text(result.model_dump_json(indent=1) + "\n")
    for check in checks:
        print(f"{check.check:20} {check.status:12} {check.summary}")
    print(path)
    return 0


def report(args: argparse.Namespace) -> int:
    results = load_dir(args.run_dir)
    if not results:
        raise SystemExit(f"{args.run_dir}: no exit-cost results")
    path = args.run_dir / "report.md"
    path.write_text(changes.report(results) + "\n")
    print(path)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", required=True, help="the API root, e.g. http://127.0.0.1:9000/v1")
    p.add_argument("--model", required=True, help="the model name requests carry")
    p.add_argument("--candidate", required=True, help="the candidate's name (the file's name)")
    p.add_argument(
        "--target",
        action="append",
        default=[],
        help="a contract run's target name this endpoint serves (repeatable)",
    )
    p.add_argument("--metrics-url", help="default: <base URL without /v1>/metrics")
    p.add_argument("--adapter", help="a LoRA adapter the endpoint serves by name")
    p.add_argument(
        "--probe-tokens",
        type=int,
        default=48,
        help="how far a request without max_tokens is followed",
    )
    p.add_argument(
        "--samples", type=int, default=3, help="requests without temperature, against a greedy one"
    )
    p.add_argument("--check", action="append", choices=list(CHECKS), help="run only these")
    p.add_argument(
        "--triton-http", help="host:port of the tritonserver behind the endpoint, if any"
    )
    p.add_argument("--api-key-env", help="environment variable holding a bearer token")
    p.add_argument("--out", help="run directory (default perf/results/exit-cost/<UTC time>)")
