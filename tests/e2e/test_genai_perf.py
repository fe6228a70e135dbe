"""genai-perf, written for upstream vllm_backend, profiles vllm_model unchanged."""

from __future__ import annotations

import csv
import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.client import metric
from tritonforge.launch.launcher import REPO_ROOT
from tritonforge.launch.model_store import DEFAULT_MODEL_NAME, models_dir

BENCH_BIN = REPO_ROOT / ".venv-bench" / "bin"
pytestmark = pytest.mark.server


def test_genai_perf_kserve_vllm_format(triton_server, tmp_path: Path) -> None:
    assert (BENCH_BIN / "genai-perf").exists(), "run scripts/setup_bench_venv.sh (make test does)"
    command = [
        str(BENCH_BIN / "genai-perf"), "profile", "-m", "vllm_model",
        "--endpoint-type", "kserve", "--backend", "vllm", "--streaming",
        "-u", triton_server.grpc_url,
        "--tokenizer", str(models_dir() / DEFAULT_MODEL_NAME),
        "--concurrency", "2", "--request-count", "4",
        "--synthetic-input-tokens-mean", "32", "--output-tokens-mean", "8",
        "--artifact-dir", str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "PATH": f"{BENCH_BIN}{os.pathsep}{os.environ['PATH']}"}
    family, labels = "vllm:request_generation_tokens", {"model": "vllm_model"}
    before = [
        metric(triton_server.metrics_url, f"{family}_{p}", **labels) for p in ("sum", "count")
    ]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (export,) = tmp_path.glob("*/profile_export_genai_perf.csv")
    # genai-perf writes numbers with thousands separators ("2,231.73" ms on a busy CPU).
    rows = {
        row[0]: [cell.replace(",", "") for cell in row[1:]]
        for row in csv.reader(export.open())
        if row
    }
    # genai-perf sends max_tokens as a string inside sampling_parameters and ignore_eos
    # is not set, so each answer has at most 8 tokens and at least one: counted by the
    # server. genai-perf counts by tokenizing the answer's text again, which may split it
    # into a token more or fewer than were generated (which words come out depends on the
    # CPU's arithmetic), so its figure is only checked to be there.
    after = [metric(triton_server.metrics_url, f"{family}_{p}", **labels) for p in ("sum", "count")]
    tokens, answered = after[0] - before[0], after[1] - before[1]
    assert answered >= 4
    assert answered <= tokens <= 8 * answered
    assert float(rows["Output Sequence Length (tokens)"][0]) >= 1
    assert float(rows["Request Count (count)"][0]) == 4
    assert float(rows["Time To First Token (ms)"][0]) > 0
