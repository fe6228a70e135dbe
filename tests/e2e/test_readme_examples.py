"""Every request example in README.md, docs/ and ensembles/README.md, and the one `make
serve` prints when ready, answers.

Examples are read from the pages at collection (tests/e2e/readme_examples.py), so an
example added to them is run here (or by the module named for it) or the inventory test
fails. Only the answer's shape is
checked (HTTP 200, the documented fields, generated text that is not empty, token counts
> 0): the words differ between CPUs.
"""

from __future__ import annotations

import pytest

from tests.conftest import OWN_SERVER_MODELS
from tests.e2e.client import model_ready
from tests.e2e.readme_examples import Addresses, Block, Curl, blocks, models, run_block, run_curl
from tritonforge.launch.launcher import OpenAIFrontend, TritonServer, example_request

pytestmark = pytest.mark.server

#: Blocks that are not requests to the server, by the start of their first line → why not run.
NOT_RUN = {
    "make serve": "the two top-level commands; `make test` is this suite",
    '{"smol-alpha"': "a multi_lora.json file, not a command",
    ".venv/bin/python -m tritonforge.repo": "writes repositories; tests/e2e/test_your_own_model.py",
    "client ─▶ tritonserver": "the layout diagram",
    "tritonforge/serving/": "the package layout",
    "docker build": "needs Docker and an NVIDIA GPU; docker/run_gpu_tests.sh",
    "INFO … [vllm.py": "log lines the vLLM adapter prints",
    "TRITONFORGE_OTLP_ENDPOINT=": "a traced make serve; tests/e2e/test_tracing.py serves one",
    "python -m tritonforge.trace": "reads a recorded export; tests/unit/trace/test_trace_cli.py",
    "trace ": "what python -m tritonforge.trace prints",
    "receivers:": "an OpenTelemetry Collector's configuration, not a command",
}
#: Steps of serving one's own model (writing and loading it) run on a server of their own.
OWN_MODEL = "tests/e2e/test_your_own_model.py"

BLOCKS = blocks()
#: Request examples for models the session server leaves out run in their own module.
ELSEWHERE = {m: "tests/e2e/test_lora.py::test_readme_lora_examples" for m in OWN_SERVER_MODELS} | {
    "vllm_embedding_model": "tests/e2e/test_embeddings.py::test_readme_embedding_examples"
}
HERE = [
    b for b in BLOCKS if b.is_request() and not b.is_own_model() and not models(b) & set(ELSEWHERE)
]


def test_every_readme_block_is_run_or_excluded_with_a_reason() -> None:
    unaccounted = [
        b.id
        for b in BLOCKS
        if not b.is_request() and not any(b.code.startswith(p) for p in NOT_RUN)
    ]
    assert not unaccounted, f"blocks neither run nor listed in NOT_RUN: {unaccounted}"
    stale = [p for p in NOT_RUN if not any(b.code.startswith(p) for b in BLOCKS)]
    assert not stale, f"NOT_RUN names blocks the pages no longer have: {stale}"
    own = [b.id for b in BLOCKS if b.is_request() and b.is_own_model()]
    assert own, f"no step of serving one's own model found for {OWN_MODEL}"
    assert len(HERE) >= 5, [b.id for b in HERE]  # the extraction itself still finds examples


@pytest.fixture(scope="module")
def addresses(triton_server: TritonServer, frontend: OpenAIFrontend) -> Addresses:
    openai = frontend.base_url.removeprefix("http://").removesuffix("/v1")
    return Addresses(http=triton_server.http_url, grpc=triton_server.grpc_url, openai=openai)


@pytest.mark.parametrize("block", HERE, ids=[b.id for b in HERE])
def test_readme_example_answers(block: Block, triton_server, addresses: Addresses) -> None:
    missing = [m for m in sorted(models(block)) if not model_ready(triton_server, m)]
    if missing:
        pytest.skip(f"{block.id} needs {missing}, not loaded on this server")
    run_block(block, addresses)


def test_the_ready_line_example_generates_text(triton_server, addresses: Addresses) -> None:
    """`make serve` prints this request; it must generate, not just echo its prompt."""
    command = example_request(triton_server, "vllm_model").removeprefix("Try: ")
    run_curl(Curl(command, None), addresses)
