"""Fixtures the e2e modules share beyond the session server of tests/conftest.py."""

from __future__ import annotations

import pytest

from tritonforge.launch.launcher import OpenAIFrontend, TritonServer


@pytest.fixture(scope="module")
def frontend(triton_server: TritonServer, tmp_path_factory: pytest.TempPathFactory):
    """This project's OpenAI frontend in front of the session's server, on a free port."""
    log = tmp_path_factory.mktemp("openai") / "openai.log"
    service = OpenAIFrontend.on_free_port(triton_server.grpc_url, log_path=log)
    service.start()
    try:
        service.wait_ready()
        yield service
    finally:
        service.stop()
