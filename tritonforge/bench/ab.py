"""One serving-ceiling contract on two or more commits, in interleaved rounds.

Why: a change to the serving path is judged against the code before it on the same
machine, in rounds that alternate between the two, so that a drift of the machine over
the run falls on both. The ceiling runner serves the code the venv that runs it imports,
and the work tree is shared (other sessions edit and run it at the same time), so each
commit is served from a ``git worktree`` of its own under ``.cache/ab/`` through a venv of
its own there: that venv reads the serving venv's packages, but finds ``tritonforge`` in
the commit's tree first — for the runner, the OpenAI frontend and Triton's stubs alike.
The work tree is never checked out or touched, and may have uncommitted changes. The
contract runs once per commit per round, the commits' order rotated each round, with this
tree's models and backends (``TRITONFORGE_MODELS``, ``TRITONFORGE_CACHE``). Each run
writes its own results directory, which records the commit it served
(``environment.served_code``, asked of the stubs' interpreter); ``ab-<first run>.json``
beside them lists every row.

    python -m tritonforge.bench ab --contract perf/contracts/serving-path-ab.yaml \\
        --rounds 3 79f8c6e 6a35ba6
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tritonforge.bench.ceiling import load_ceiling_contract
from tritonforge.bench.run_plan import rotated
from tritonforge.launch.model_store import models_dir
from tritonforge.paths import CACHE_DIR, REPO_ROOT, make_machine_free

#: Where each commit's worktree and venv live while a run needs them.
AB_DIR = CACHE_DIR / "ab"


def git(*args: str, cwd: Path = REPO_ROOT) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def overlay_venv(where: Path, tree: Path) -> Path:
    """A venv at ``where`` that imports ``tritonforge`` from ``tree`` and everything else
    from this venv; its interpreter.

    Its one ``.pth`` file puts ``tree`` on ``sys.path`` ahead of this venv's site-packages
    (added after it, its own ``.pth`` files run): the standard path finder then finds the
    commit's ``tritonforge`` before the editable install's finder, which comes last. A
    ``.pth`` is read in the isolated mode Triton's stubs run in too.
    """
    base = Path(getattr(sys, "_base_executable", sys.executable))
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    (Path(site) / "00-tritonforge-ab.pth").write_text(
        f"{tree}\nimport site; site.addsitedir({ours!r})\n"
    )
    return python


@contextmanager
def served_trees(commits: Sequence[str]) -> Iterator[dict[str, Path]]:
    """Each commit's worktree and the interpreter that serves it; removed at the end."""
    AB_DIR.mkdir(parents=True, exist_ok=True)
    pythons: dict[str, Path] = {}
    trees: list[Path] = []
    try:
        for commit in commits:
            tree = Path(tempfile.mkdtemp(prefix=f"{commit}-", dir=AB_DIR))
            git("worktree", "add", "--detach", str(tree / "src"), commit)
            trees.append(tree)
            pythons[commit] = overlay_venv(tree / "venv", tree / "src")
        yield pythons
    finally:
        for tree in trees:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree / "src")],
                cwd=REPO_ROOT,
                check=False,
                capture_output=True,
            )
            shutil.rmtree(tree, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=REPO_ROOT, check=False)


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
    name = load_ceiling_contract(contract_path).name
    resolved = [git("rev-parse", "--short", c) for c in commits]
    results = results.resolve()
    rows: list[dict[str, Any]] = []
    # an older commit may not have the contract: every run reads a copy kept outside the tree
    with tempfile.TemporaryDirectory(prefix="ab-") as scratch, served_trees(resolved) as pythons:
        contract = Path(scratch) / contract_path.name
        contract.write_text(contract_path.read_text())
        # this tree's models and backends, not the (empty) worktree's .cache
        env = {**os.environ, "TRITONFORGE_CACHE": str(CACHE_DIR)}
        env["TRITONFORGE_MODELS"] = str(models_dir())
        for index, commit in schedule(resolved, rounds):
            command = [str(pythons[commit]), "-m", "tritonforge.bench", "ceiling"]
            command += ["--contract", str(contract), "--results", str(results)]
            tree = pythons[commit].parent.parent.parent / "src"
            subprocess.run(command, cwd=tree, env=env, check=True)
            run = newest_run(results, name)
            served = json.loads((run / "results.json").read_text())["environment"]["git_commit"]
            if not served.startswith(commit):
                raise RuntimeError(f"the run for {commit} served {served[:12]}")
            for folder in (run, run / "logs"):  # the worktree's runner named this tree's paths
                if folder.is_dir():
                    make_machine_free(folder)
            rows += summary_rows(commit, index, run)
            print(json.dumps(rows[-1]), flush=True)
    if not rows:
        return None
    out = results / name / f"ab-{rows[0]['run']}.json"
    out.write_text(json.dumps({"commits": resolved, "rows": rows}, indent=1) + "\n")
    return out
