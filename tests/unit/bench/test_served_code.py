"""A result names the code its server ran, asked of a real venv, without a server.

Each test builds two git work trees holding a ``tritonforge`` package and a venv whose
site-packages points at one of them with a ``.pth`` file, as an editable install does;
the interpreter is then asked in isolated mode, as Triton's stub imports.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tritonforge.bench import report
from tritonforge.bench.environment import (
    Environment,
    ServedCodeMismatch,
    describe_code,
    served_code,
)

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]


def work_tree(path: Path, dirty: bool = False) -> tuple[Path, str]:
    """A git work tree with a committed ``tritonforge`` package; its root and commit."""
    (path / "tritonforge").mkdir(parents=True)
    init = path / "tritonforge" / "__init__.py"
    init.write_text('"""a checkout"""\n')
    subprocess.run([*GIT, "init", "-q", str(path)], check=True)
    subprocess.run([*GIT, "-C", str(path), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(path), "commit", "-q", "-m", "c"], check=True)
    commit = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if dirty:
        init.write_text('"""a checkout, edited"""\n')
    return path, commit


def venv_serving(tree: Path, where: Path) -> Path:
    """A venv whose site-packages maps ``tritonforge`` to ``tree``; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    site = next(where.glob("lib/python*/site-packages"))
    (site / "checkout.pth").write_text(f"{tree}\n")
    return where / "bin" / "python"


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("served")
    launching, launching_commit = work_tree(root / "launching")
    other, other_commit = work_tree(root / "other", dirty=True)
    return {
        "launching": launching,
        "launching_commit": launching_commit,
        "other": other,
        "other_commit": other_commit,
        "python_here": venv_serving(launching, root / "venv-here"),
        "python_other": venv_serving(other, root / "venv-other"),
    }


def test_a_run_launched_from_another_tree_is_refused_naming_both_commits(trees) -> None:
    with pytest.raises(ServedCodeMismatch) as refused:
        served_code(trees["python_other"], launching=trees["launching"])
    message = str(refused.value)
    assert trees["launching_commit"][:12] in message and trees["other_commit"][:12] in message
    assert "uncommitted changes" in message and "--allow-served-mismatch" in message


def test_the_flag_runs_it_and_the_result_says_so(trees) -> None:
    code = served_code(trees["python_other"], launching=trees["launching"], allow_mismatch=True)
    assert (code.tree, code.git_commit, code.git_dirty) == ("../other", trees["other_commit"], True)
    assert code.mismatch_allowed and code.launched_from is not None
    assert code.launched_from.git_commit == trees["launching_commit"]
    assert not code.launched_from.git_dirty
    line = describe_code(environment(code))
    assert "served code from another tree" in line
    assert trees["other_commit"][:12] in line and trees["launching_commit"][:12] in line


def test_the_same_tree_records_one_commit(trees) -> None:
    code = served_code(trees["python_here"], launching=trees["launching"])
    assert (code.tree, code.git_commit, code.git_dirty) == (".", trees["launching_commit"], False)
    assert code.launched_from is None and not code.mismatch_allowed
    env = environment(code)
    assert env.git_commit == code.git_commit
    assert "another tree" not in describe_code(env)


def test_the_report_labels_a_result_served_from_another_tree(trees) -> None:
    from tests.unit.bench.test_bench_rounds import run_result

    code = served_code(trees["python_other"], launching=trees["launching"], allow_mismatch=True)
    run = run_result(noisy=False)
    run.environment = environment(code)
    assert "**served code from another tree** (`../other`)" in report.render(run, [])


def test_an_older_result_says_its_commit_is_the_launching_trees() -> None:
    from tests.unit.bench.test_bench_rounds import run_result

    env = run_result(noisy=False).environment
    assert env.served_code is None
    assert "the served tree was not recorded" in describe_code(env)


def environment(code) -> Environment:
    from tests.unit.bench.test_bench_rounds import run_result

    return run_result(noisy=False).environment.model_copy(
        update={"git_commit": code.git_commit, "git_dirty": code.git_dirty, "served_code": code}
    )
