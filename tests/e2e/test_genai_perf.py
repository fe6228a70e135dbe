"""genai-perf, written for upstream vllm_backend, profiles vllm_model unchanged."""

from __future__ import annotations

import csv
import os
import subprocess
from pathlib import Path

import pytest

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
    # is not set, so each answer has at most 8 tokens and at least one.
    average_output = float(rows["Output Sequence Length (tokens)"][0])
    assert 1 <= average_output <= 8
    assert float(rows["Request Count (count)"][0]) == 4
    assert float(rows["Time To First Token (ms)"][0]) > 0
