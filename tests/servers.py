"""Servers a test starts for itself: up for a block, stopped after it, their log on failure."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from tritonforge.launch.launcher import TritonServer


@contextlib.contextmanager
def serving(server: TritonServer, failure: str) -> Iterator[TritonServer]:
    """``server`` started and ready for the block, stopped after it.

    A server that never gets ready fails the test with ``failure`` and its log's tail
    (where the reason is), not with a traceback of the wait.
    """
    server.start()
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        log = server.log_path
        tail = log.read_text(errors="replace")[-4000:] if log and log.exists() else ""
        pytest.fail(f"{failure}:\n{tail}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()
