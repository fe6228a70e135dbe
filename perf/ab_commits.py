"""One serving-ceiling contract on two or more commits, in interleaved rounds.

Why: a change to the serving path is judged against the code before it on the same
machine, in rounds that alternate between the two, so that a drift of the machine over
the run falls on both. The runner (``python -m tritonforge.bench ceiling``) serves the code
of the work tree the venv imports, so this checks each commit out in that tree in turn
(the tree must be clean; the branch is restored at the end) and runs the contract once
per commit per round, the commits' order rotated each round. Each run writes its own
results directory, which records the commit it served; the summary lists them.

    .venv/bin/python perf/ab_commits.py --contract perf/contracts/serving-path-ab.yaml \\
        --rounds 3 79f8c6e 6a35ba6
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()


def newest_run(results: Path, name: str) -> Path:
    """The latest run directory of contract ``name`` (other entries beside them skipped)."""
    runs = [path for path in (results / name).iterdir() if (path / "results.json").is_file()]
    return max(runs, key=lambda path: path.name)


def summary_row(commit: str, round_index: int, run: Path) -> list[dict]:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("commits", nargs="+", help="commits to serve, in the first round's order")
    parser.add_argument("--contract", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results", type=Path, default=REPO / "perf/results")
    opts = parser.parse_args()
    if git("status", "--porcelain", "--untracked-files=no"):
        sys.exit("the work tree has uncommitted changes: commit or stash them first")
    branch = git("rev-parse", "--abbrev-ref", "HEAD")
    start = git("rev-parse", "HEAD") if branch == "HEAD" else branch
    # an older commit may not have the contract: run a copy kept outside the tree
    text = opts.contract.read_text()
    name = yaml.safe_load(text)["name"]
    scratch = tempfile.TemporaryDirectory(prefix="ab-commits-")
    contract = Path(scratch.name) / opts.contract.name
    contract.write_text(text)
    commits = [git("rev-parse", "--short", c) for c in opts.commits]
    rows: list[dict] = []
    try:
        for index in range(opts.rounds):
            shift = index % len(commits)
            for commit in commits[shift:] + commits[:shift]:
                git("checkout", "-q", commit)
                subprocess.run(
                    [sys.executable, "-m", "tritonforge.bench", "ceiling",
                     "--contract", str(contract), "--results", str(opts.results)],
                    cwd=REPO, check=True,
                )  # fmt: skip
                run = newest_run(opts.results, name)
                rows += summary_row(commit, index, run)
                print(json.dumps(rows[-1]), flush=True)
    finally:
        git("checkout", "-q", start)
        scratch.cleanup()
    out = opts.results / name / f"ab-{rows[0]['run']}.json" if rows else None
    if out is not None:
        out.write_text(json.dumps({"commits": commits, "rows": rows}, indent=1) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
