"""The micro-benchmark harness every offline engine probe runs on.

Why one harness: a probe measures a cost too small or too far from a served request for a
contract (an engine's step time, a collector pass, the runtime's Python per token), and
such numbers drift with the machine as much as the served ones. So every probe runs the
same way as a contract's targets: each candidate once a round in a fresh process of its
own, the candidates' order rotated every round, the foreign CPU share recorded around each
(:class:`tritonforge.bench.noise.RoundWatch`), and the rows written as a new run's
``results.json`` under ``perf/results/<name>/`` without this machine's paths. A probe
supplies only the measurement: a Python program that prints one ``RESULT{json}`` line.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tritonforge.bench.environment import capture
from tritonforge.bench.noise import RoundWatch
from tritonforge.bench.run_plan import rotated
from tritonforge.launch.launcher import server_environment
from tritonforge.paths import REPO_ROOT, make_machine_free, new_run_dir

RESULTS_ROOT = REPO_ROOT / "perf" / "results"
#: The line a probe program prints its measurement on, followed by the JSON.
MARK = "RESULT"
DEFAULT_MODEL = "SmolLM2-135M-Instruct"


class ProbeFailed(RuntimeError):
    """A probe process ended without printing its result."""


def run_program(
    program: str,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout_s: float = 900,
) -> dict[str, Any]:
    """Run ``program`` (Python source) in a fresh interpreter; the JSON of its RESULT line.

    A fresh process per measurement: what an earlier candidate imported, allocated or
    warmed up cannot flatter the next one.
    """
    done = subprocess.run(
        [sys.executable, "-c", program, *args],
        env=dict(env) if env is not None else None,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    if done.returncode != 0 or not lines:
        raise ProbeFailed(f"probe exited with {done.returncode}: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len(MARK) :])
    return result


def interleaved(
    candidates: Sequence[str],
    rounds: int,
    measure: Callable[[str], dict[str, Any]],
    label: str = "candidate",
) -> list[dict[str, Any]]:
    """Every candidate measured once a round, the order rotated; a row per measurement
    with the round, the candidate (under ``label``) and the machine's noise beside it."""
    rows: list[dict[str, Any]] = []
    for index in range(rounds):
        for name in rotated(candidates, index):
            with RoundWatch(quiet_window_s=2.0) as watch:
                result = measure(name)
            assert watch.sample is not None
            row = {"round": index, label: name, **result}
            print(json.dumps(row), flush=True)
            rows.append(row | {"noise": watch.sample.model_dump()})
    return rows


def model_dir(name: str = DEFAULT_MODEL) -> Path:
    """The prepared model directory the serving environment points at."""
    return Path(server_environment()["TRITONFORGE_MODELS"]) / name


def probe_environment(model: Path | None = None) -> dict[str, Any]:
    """The environment a probe's record starts with: machine, versions, model, commit."""
    return capture(model or model_dir()).model_dump()


def save(record: Mapping[str, Any], name: str, root: Path = RESULTS_ROOT) -> Path:
    """``record`` as a new run's results.json under ``root/name``, machine paths removed."""
    out_dir = new_run_dir(root / name)
    (out_dir / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    make_machine_free(out_dir)
    print(f"wrote {out_dir / 'results.json'}")
    return out_dir


def git(*args: str) -> str:
    """Run git in the repository; its output, stripped."""
    return subprocess.run(
        ["git", *args], cwd=REPO_ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()


@contextlib.contextmanager
def commit_trees(commits: Sequence[str], prefix: str) -> Iterator[dict[str, Path]]:
    """Each commit checked out in a detached worktree of its own, removed on exit: a probe
    runs several commits' code without touching the work tree others are using."""
    with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
        trees = {commit: Path(scratch) / commit for commit in commits}
        try:
            for commit, tree in trees.items():
                git("worktree", "add", "--detach", str(tree), commit)
            yield trees
        finally:
            for tree in trees.values():
                if tree.exists():
                    git("worktree", "remove", "--force", str(tree))
