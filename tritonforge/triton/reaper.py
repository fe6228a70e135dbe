"""Take a stub's engine processes down with the stub, however the stub ends.

vLLM runs its engine in child processes (EngineCore, its workers, multiprocessing's
resource tracker). They exit cleanly when the model is unloaded, because ``finalize``
shuts the engine down. But when tritonserver gives up waiting on shutdown ("Exit
timeout expired. Exiting immediately.") or is killed, each stub exits without
``finalize`` and its engine processes live on, holding memory and ports, reparented
to init; the stub itself can outlive the server by many seconds (measured: still
running 10 s after tritonserver exited). Nothing in the stub can act at that point,
so a small process does: it notes the stub's descendants every second and, once the
stub or its server is gone, terminates the ones still running — and the stub, when
the server went first — then kills what ignores SIGTERM and exits.

Run as ``python -m tritonforge.triton.reaper STUB_PID SERVER_PID`` by :func:`start_reaper`.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import psutil

POLL_S = 1.0
TERM_GRACE_S = 3.0


def _descendants(pid: int, me: int) -> dict[int, float]:
    """pid → create time of every live descendant of ``pid`` but this process."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return {}
    found = {}
    for child in children:
        if child.pid == me:
            continue
        try:
            found[child.pid] = child.create_time()
        except psutil.Error:
            continue
    return found


def _still_ours(pid: int, created: float) -> psutil.Process | None:
    """The process, if ``pid`` still names the one noted (pids are reused)."""
    try:
        proc = psutil.Process(pid)
        return proc if proc.create_time() == created else None
    except psutil.Error:
        return None


def _alive(pid: int) -> bool:
    """Running (an exited process its parent has not waited for yet counts as gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def reap(known: dict[int, float]) -> int:
    """Terminate the noted processes still running, kill the stubborn; returns how many."""
    procs = [p for pid, created in known.items() if (p := _still_ours(pid, created))]
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(procs, timeout=TERM_GRACE_S)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            continue
    return len(procs)


def watch(stub: int, server: int, poll_s: float = POLL_S) -> int:
    """Note the stub's descendants until it or its server is gone, then reap them."""
    me = os.getpid()
    known: dict[int, float] = {}
    while _alive(stub) and _alive(server):
        known = _descendants(stub, me) or known
        time.sleep(poll_s)
    with contextlib.suppress(psutil.Error):  # the server went first: the stub is an orphan
        known[stub] = psutil.Process(stub).create_time()
    ended = reap(known)
    if ended:  # into the server's log (stderr is the stub's): what was left, and ended
        print(
            f"[tritonforge reaper] stub {stub} or server {server} gone: ended {ended} "
            "process(es) left behind",
            file=sys.stderr,
            flush=True,
        )
    return ended


def start_reaper() -> subprocess.Popen[bytes] | None:
    """Start the reaper for this stub; it outlives the stub only to clean up after it."""
    try:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tritonforge.triton.reaper",
                str(os.getpid()),
                str(os.getppid()),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            close_fds=True,
        )
    except OSError:
        return None


if __name__ == "__main__":
    watch(int(sys.argv[1]), int(sys.argv[2]))
