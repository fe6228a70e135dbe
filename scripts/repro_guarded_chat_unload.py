"""Reproducer of guarded_chat's unload hang (W12, caused by W14): the upgrade check of W14.

Starts a private tritonserver with vllm_model, guard and guarded_chat, then repeats: an
inner error, a readiness probe, a short answer, a client cancel after five responses, a
probe, one second idle, a client cancel after two responses and, right after it, an unload
of guarded_chat. An unload normally takes ~1.5 s; when guarded_chat is still UNLOADING
after ``--wait`` seconds the script reports the iteration and stops (exit status 1).

On Triton 2.51 the unload hangs within a few iterations when the client also cancels
requests that have already ended; with the client cancelling only running requests it
unloads cleanly. Triton 2.51 workarounds W12 and W14, see docs/triton-2.51-workarounds.md.

    .venv/bin/python scripts/repro_guarded_chat_unload.py --iterations 20
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.client import control_model, llm_inputs, model_state, stream  # noqa: E402
from tritonforge.launch.launcher import TritonServer  # noqa: E402

GREEDY = {"temperature": 0, "max_tokens": 48}
LONG = {"max_tokens": 1500, "ignore_eos": True}


def _probe(server: TritonServer) -> None:
    requests.get(f"http://{server.http_url}/v2/models/guarded_chat/ready", timeout=10)


def _iteration(server: TritonServer) -> None:
    url = server.grpc_url
    stream(url, "guarded_chat", llm_inputs("word " * 2100, GREEDY))  # too long: inner error
    _probe(server)
    stream(url, "guarded_chat", llm_inputs("Say hi.", {"max_tokens": 4}))
    stream(
        url,
        "guarded_chat",
        llm_inputs("Tell me a long story.", {**LONG, "temperature": 0}),
        stop_after=5,
    )
    _probe(server)
    time.sleep(1)
    stream(url, "guarded_chat", llm_inputs("Tell me a long story.", LONG), stop_after=2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--wait", type=float, default=15.0, help="seconds an unload may take")
    parser.add_argument("--log", type=Path, default=Path("repro-guarded-chat.log"))
    args = parser.parse_args()

    server = TritonServer.on_free_ports(
        models=["vllm_model", "guard", "guarded_chat"], log_path=args.log
    )
    server.start()
    try:
        server.wait_ready()
        for n in range(1, args.iterations + 1):
            _iteration(server)
            started = time.monotonic()
            control_model(server.grpc_url, "unload", "guarded_chat")
            while time.monotonic() - started < args.wait:
                if model_state(server.http_url, "guarded_chat") == "UNAVAILABLE":
                    break
                time.sleep(0.2)
            else:
                print(f"iteration {n}: guarded_chat still UNLOADING after {args.wait:.0f} s")
                return 1
            print(f"iteration {n}: unloaded in {time.monotonic() - started:.1f} s", flush=True)
            control_model(server.grpc_url, "load", "guarded_chat")
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
