"""One serving-ceiling contract on two or more commits, in interleaved rounds.

Why: a change to the serving path is judged against the code before it on the same
machine, in rounds that alternate between the two, so that a drift of the machine over
the run falls on both. The ceiling runner serves the code of the work tree the venv
imports, so this checks each commit out in that tree in turn (the tree must be clean; the
branch is restored at the end) and runs the contract once per commit per round, the
commits' order rotated each round. Each run writes its own results directory, which
records the commit it served (``environment.served_code``); ``ab-<first run>.json`` beside
them lists every row.

    python -m tritonforge.bench ab --contract perf/contracts/serving-path-ab.yaml \\
        --rounds 3 79f8c6e 6a35ba6
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tritonforge.bench.ceiling import load_ceiling_contract
from tritonforge.bench.run_plan import rotated
from tritonforge.paths import REPO_ROOT


class DirtyTree(RuntimeError):
    """Checking out another commit would carry uncommitted changes into every run."""


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO_ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()


def schedule(commits: Sequence[str], rounds: int) -> list[tuple[int, str]]:
    """(round, commit) in the order they run: every commit once a round, order rotated."""
    return [(index, commit) for index in range(rounds) for commit in rotated(commits, index)]


def newest_run(results: Path, name: str) -> Path:
    """The latest run directory of contract ``name`` (other entries beside them skipped)."""
    runs = [path for path in (results / name).iterdir() if (path / "results.json").is_file()]
    return max(runs, key=lambda path: path.name)


def summary_rows(commit: str, round_index: int, run: Path) -> list[dict[str, Any]]:
    """One row per target and level of a ceiling run, tagged with the commit it served."""
    rows = json.loads((run / "results.json").read_text())["rows"]
    return [
        {
            "commit": commit,
            "round": round_index,
            "run": run.name,
            "target": row["target"],
            "concurrency": row["concurrency"],
            "tokens_per_s": round(row["tokens_per_s"]),
            "server_cpu_us_per_token": round(row["server_cpu_us_per_token"], 1),
            "cpu_us_per_token": {k: round(v, 1) for k, v in row["cpu_us_per_token"].items()},
            "tokens_per_response": round(row["tokens_per_response"], 2),
            "ttft_ms": row["ttft_ms"],
            "itl_ms": row["itl_ms"],
            "noisy": row["noisy"],
        }
        for row in rows
    ]


def run_ab(contract_path: Path, commits: Sequence[str], rounds: int, results: Path) -> Path | None:
    """Run the contract per commit per round; the summary's path (None if nothing ran)."""
    if git("status", "--porcelain", "--untracked-files=no"):
        raise DirtyTree("the work tree has uncommitted changes: commit them first")
    name = load_ceiling_contract(contract_path).name
    branch = git("rev-parse", "--abbrev-ref", "HEAD")
    start = git("rev-parse", "HEAD") if branch == "HEAD" else branch
    resolved = [git("rev-parse", "--short", c) for c in commits]
    rows: list[dict[str, Any]] = []
    # an older commit may not have the contract: every run reads a copy kept outside the tree
    with tempfile.TemporaryDirectory(prefix="ab-") as scratch:
        contract = Path(scratch) / contract_path.name
        contract.write_text(contract_path.read_text())
        try:
            for index, commit in schedule(resolved, rounds):
                git("checkout", "-q", commit)
                command = [sys.executable, "-m", "tritonforge.bench", "ceiling"]
                command += ["--contract", str(contract), "--results", str(results)]
                subprocess.run(command, cwd=REPO_ROOT, check=True)
                rows += summary_rows(commit, index, newest_run(results, name))
                print(json.dumps(rows[-1]), flush=True)
        finally:
            git("checkout", "-q", start)
    if not rows:
        return None
    out = results / name / f"ab-{rows[0]['run']}.json"
    out.write_text(json.dumps({"commits": resolved, "rows": rows}, indent=1) + "\n")
    return out
