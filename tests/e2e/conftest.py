"""Fixtures the e2e modules share beyond the session server of tests/conftest.py."""

from __future__ import annotations

import pytest

from tests.e2e.client import openai_frontend
from tritonforge.launch.launcher import TritonServer


@pytest.fixture(scope="module")
def frontend(triton_server: TritonServer, tmp_path_factory: pytest.TempPathFactory):
    """This project's OpenAI frontend in front of the session's server, on a free port."""
    log = tmp_path_factory.mktemp("openai") / "openai.log"
    with openai_frontend(triton_server, log) as service:
        yield service
