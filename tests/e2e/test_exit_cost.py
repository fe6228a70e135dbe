"""The exit-cost suite against this project's OpenAI frontend on the session server.

What an application written against another OpenAI-compatible runtime expects must hold
here too: every check passes (the adapter one is not run: the session server serves no
LoRA model), driven through the command line as a user runs it. Budgets are the suite's
own (≤ 64 tokens), a default bound followed for 4 chunks, two unseeded samples.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.client import model_ready
from tritonforge.bench.__main__ import main
from tritonforge.bench.exit_cost.checks import CHECKS
from tritonforge.bench.exit_cost.results import SuiteResult
from tritonforge.launch.launcher import OpenAIFrontend, TritonServer

pytestmark = pytest.mark.server

MODEL = "vllm_model"


def test_every_check_passes_on_the_frontend_and_the_record_says_so(
    frontend: OpenAIFrontend, triton_server: TritonServer, tmp_path: Path
) -> None:
    if not model_ready(triton_server, MODEL):
        pytest.skip(f"{MODEL} is not loaded on this machine")
    args = ["--base-url", frontend.base_url, "--model", MODEL, "--probe-tokens", "4"]
    args += ["--samples", "2"]
    assert main(["exit-cost", *args, "--candidate", "here", "--out", str(tmp_path)]) == 0
    result = SuiteResult.model_validate_json((tmp_path / "here.json").read_text())
    statuses = {c.check: c.status for c in result.checks}
    assert statuses == {name: "passed" for name in CHECKS} | {"adapter": "not run"}, [
        (c.check, c.summary) for c in result.checks if c.status != "passed"
    ]
    assert result.check("chat_template").behaviour["prompt_tokens"] > 0  # type: ignore[union-attr]
    signals = result.check("metrics").behaviour["signals"]  # type: ignore[union-attr]
    assert "vllm:num_requests_running" in signals["requests running"]
    assert result.environment["git_commit"] and result.environment["machine"]["cores"] >= 1

    assert main(["exit-cost-report", str(tmp_path)]) == 0
    assert "| chat_template | passed:" in (tmp_path / "report.md").read_text()
