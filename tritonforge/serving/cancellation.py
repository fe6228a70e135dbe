"""Cancelling a request that a BLS model sent to another model (Triton 24.10).

The python backend of Triton 24.10 gives a BLS caller no way to cancel a request it
sent: ``ResponseIterator.cancel()`` arrived in a later release, and dropping the
iterator lets the callee run to ``max_tokens``. Until the server is upgraded, caller
and callee share a cancellation board: the caller names its inner request
(``request_id``) and, when its own client cancels, marks that id on the board; the
callee's runtime already polls ``is_cancelled()`` for every in-flight request and
checks the board too, so the engine aborts the request within one poll interval.

The board is a directory of empty files private to one server process (every stub is
a child of the tritonserver process): existence checks cost about a microsecond and
need no shared state beyond the file system. Ids are hashed, so any string is safe.

Triton 2.51 workaround W1, see docs/triton-2.51-workarounds.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path


def _default_directory() -> Path:
    # Stubs are children of tritonserver: its pid names a board shared by its models.
    return Path(tempfile.gettempdir()) / f"tritonforge-cancel-{os.getppid()}"


class CancelBoard:
    """Marks request ids as cancelled, across the stub processes of one server."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or _default_directory()

    def _path(self, request_id: str) -> Path:
        return self.directory / hashlib.sha256(request_id.encode()).hexdigest()[:32]

    def cancel(self, request_id: str) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._path(request_id).touch()

    def is_cancelled(self, request_id: str) -> bool:
        return bool(request_id) and self._path(request_id).exists()

    def clear(self, request_id: str) -> None:
        """Forget the mark once the request is over (the caller's job)."""
        self._path(request_id).unlink(missing_ok=True)

    def tidy(self) -> None:
        """Remove the board's directory if no mark is left (a caller's finalize)."""
        with contextlib.suppress(OSError):
            self.directory.rmdir()
