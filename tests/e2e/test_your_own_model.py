"""A newcomer serves a model of their own by following the pages: the commands of
docs/your-own-model.md and README.md's "Serving your own model", run as written.

The pages write into `model_repository/` and talk to `make serve`'s ports; here the
repository is a temporary one (`--repository model_repository` rewritten) served by a
tritonserver of its own that starts with no model loaded, so the pages' own load requests
bring the new models up. The page's blocks run first, in order, then the README's: every
model they write must load and answer.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.readme_examples import Addresses, Block, blocks, curl_commands, run_curl
from tests.servers import serving
from tritonforge.launch.launcher import REPO_ROOT, TritonServer

pytestmark = [pytest.mark.server, pytest.mark.last]

PAGE = "docs/your-own-model.md"
#: The page's blocks first (it writes the HF model and the GGUF one), then the README's.
STEPS = sorted((b for b in blocks() if b.is_own_model()), key=lambda b: (b.source != PAGE, b.line))
_REPOSITORY = re.compile(r"--repository\s+model_repository\b")
_PYTHON = re.compile(r"(?m)^\s*\.venv/bin/python\b")


def localised(code: str, repository: Path) -> str:
    """A shell block as it runs here: this interpreter, the temporary repository."""
    code = _PYTHON.sub(sys.executable, code)
    return _REPOSITORY.sub(f"--repository {repository}", code)


def test_the_pages_show_how_to_write_load_and_ask_a_model() -> None:
    sources = {b.source for b in STEPS}
    assert {PAGE, "README.md"} <= sources, sources
    code = "\n".join(b.code for b in STEPS)
    assert "tritonforge.repo add --engine vllm" in code  # a Hugging Face checkpoint
    assert "tritonforge.repo add --engine llamacpp" in code  # a GGUF
    assert "/load" in code and "/generate" in code
    assert all(_REPOSITORY.search(b.code) for b in STEPS if "tritonforge.repo" in b.code)


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    repository = tmp_path_factory.mktemp("own-model") / "model_repository"
    repository.mkdir()
    log = tmp_path_factory.mktemp("own-model-server") / "server.log"
    server = TritonServer.on_free_ports(repository=repository, models=[], log_path=log)
    with serving(server, "the server for one's own models did not start"):
        yield server


@pytest.mark.parametrize("step", STEPS, ids=[b.id for b in STEPS])
def test_your_own_model_step(step: Block, own_server: TritonServer) -> None:
    """Each step runs in page order on the same server: the repository tool's commands in
    bash, then each curl command with its answer checked (a load answers 200)."""
    addresses = Addresses(http=own_server.http_url, grpc=own_server.grpc_url)
    curls = curl_commands(step.code)
    shell = step.code
    for curl in curls:
        shell = shell.replace(curl.command, "")
    if shell.strip():
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", localised(shell, own_server.repository)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, f"{step.id} failed:\n{done.stdout}\n{done.stderr}"
    for curl in curls:
        run_curl(curl, addresses)
