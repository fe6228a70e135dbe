"""Fixtures the e2e modules share beyond the session server of tests/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tritonforge.launch.launcher import OpenAIFrontend, TritonServer


@contextmanager
def openai_frontend(grpc_url: str, log_path: Path) -> Iterator[OpenAIFrontend]:
    """This project's OpenAI frontend in front of ``grpc_url`` on a free port, ready."""
    service = OpenAIFrontend.on_free_port(grpc_url, log_path=log_path)
    service.start()
    try:
        service.wait_ready()
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="module")
def frontend(triton_server: TritonServer, tmp_path_factory: pytest.TempPathFactory):
    """This project's OpenAI frontend in front of the session's server, on a free port."""
    log = tmp_path_factory.mktemp("openai") / "openai.log"
    with openai_frontend(triton_server.grpc_url, log) as service:
        yield service
