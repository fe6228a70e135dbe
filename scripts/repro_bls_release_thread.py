"""Which thread frees a decoupled BLS call's responses in guarded_chat's stub (W17).

Starts a private tritonserver with vllm_model, guard and guarded_chat, attaches gdb to
guarded_chat's python-backend stub (its binary carries symbols) and records the stack of
every call of ``ResponseIterator::~ResponseIterator`` and ``PbTensor::~PbTensor``. Then it
sends ``--requests`` streamed requests, every other one cancelled after two responses,
and prints a count per kind of stack.

python_backend 24.10 frees a BLS call's iterator wherever its last owner lets go: the
model's thread (holding the GIL) or the stub's stub-to-parent thread, where the map of
live calls is erased (``Stub::SendCleanupId``, never holding the GIL). A response tensor
freed there drops its numpy arrays without the GIL. Against a ``guarded_chat`` that makes
BLS calls (``--repository`` of a copy holding one, such as a2e9b4c's), 12 requests here
freed 7 calls' iterators and 32 response tensors on that thread; the ``guarded_chat`` of
W17 makes no BLS call, so nothing is recorded for it.

    .venv/bin/python scripts/repro_bls_release_thread.py --requests 20

Needs gdb. Exit status 1 when any tensor was freed on a thread without the GIL.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.client import llm_inputs, stream  # noqa: E402
from tritonforge.launch.launcher import TritonServer  # noqa: E402
from tritonforge.paths import MODEL_REPOSITORY  # noqa: E402

#: gdb's Python: one JSON line per destructor call, the process never stopped for long.
GDB_SCRIPT = r"""
import gdb, json
OUT = {out!r}
class Record(gdb.Breakpoint):
    def stop(self):
        frames, frame = [], gdb.newest_frame()
        while frame is not None and len(frames) < 40:
            frames.append(frame.name() or "?")
            frame = frame.older()
        with open(OUT, "a") as out:
            out.write(json.dumps({{"at": self.location, "frames": frames}}) + "\n")
        return False
gdb.execute("set pagination off")
Record("triton::backend::python::ResponseIterator::~ResponseIterator")
Record("triton::backend::python::PbTensor::~PbTensor")
gdb.execute("continue")
"""


def stub_of(server: TritonServer, model: str) -> int:
    """The pid of ``model``'s python-backend stub (a child of tritonserver)."""
    assert server.process is not None
    for child in psutil.Process(server.process.pid).children(recursive=True):
        if "triton_python_backend_stub" in child.name() and any(
            f"/{model}/" in part for part in child.cmdline()
        ):
            return child.pid
    raise RuntimeError(f"no stub for {model}")


def without_gil(record: dict) -> bool:
    """Freed on the stub-to-parent thread, whose code never takes the GIL."""
    return "triton::backend::python::Stub::SendCleanupId" in " ".join(record["frames"])


def kind(record: dict) -> str:
    what = record["at"].split("::")[-1]
    where = "the stub-to-parent thread, no GIL" if without_gil(record) else "a model thread"
    return f"{what} on {where}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--repository", type=Path, default=MODEL_REPOSITORY)
    parser.add_argument("--log", type=Path, default=Path("repro-bls-release.log"))
    args = parser.parse_args()
    server = TritonServer.on_free_ports(
        models=["vllm_model", "guard", "guarded_chat"],
        repository=args.repository,
        log_path=args.log,
    )
    records = Path(tempfile.mkdtemp()) / "destructors.jsonl"
    server.start()
    gdb = None
    try:
        server.wait_ready()
        script = records.with_suffix(".py")
        script.write_text(GDB_SCRIPT.format(out=str(records)))
        pid = stub_of(server, "guarded_chat")
        gdb = subprocess.Popen(
            ["gdb", "-q", "-batch", "-p", str(pid), "-x", str(script)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(3)  # gdb attaches and sets its breakpoints (a script, not a test)
        for i in range(args.requests):
            inputs = llm_inputs(f"Tell story number {i}.", {"max_tokens": 6, "seed": i})
            stream(server.grpc_url, "guarded_chat", inputs, stop_after=2 if i % 2 else None)
        time.sleep(2)  # the last calls' clean-up
    finally:
        server.stop()
        if gdb is not None:
            gdb.wait(timeout=60)
    seen = (
        [json.loads(line) for line in records.read_text().splitlines()] if records.exists() else []
    )
    counts = Counter(kind(r) for r in seen)
    for what, count in sorted(counts.items()):
        print(f"{count:5d}  {what}")
    unsafe = sum(1 for r in seen if r["at"].endswith("~PbTensor") and without_gil(r))
    print(f"{args.requests} requests: {unsafe} tensor(s) freed without the GIL")
    return 1 if unsafe else 0


if __name__ == "__main__":
    sys.exit(main())
