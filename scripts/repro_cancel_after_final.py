"""Repro: a gRPC stream cancelled the moment its ensemble request ended keeps it UNLOADING.

An asyncio client that cancels each gRPC call as soon as the FINAL response arrives can
leave the server's ensemble_vllm UNLOADING for good (shutdown then runs into its exit
timeout); not on every run. Closing the call politely (half-close, let the server end
it) unloads cleanly, which is why the reliability suite's client does so. It is a race:
tritonclient's threaded ``stop_stream(cancel_requests=True)`` after FINAL, which
tests/e2e/client.stream() does, cancels later and did not reproduce it here.

    .venv/bin/python scripts/repro_cancel_after_final.py            # cancel at FINAL
    .venv/bin/python scripts/repro_cancel_after_final.py --polite   # half-close instead

Sends a few requests to ensemble_vllm, each on its own stream, unloads it over gRPC and
prints its state 15 s later (UNAVAILABLE: unloaded; UNLOADING: stuck). Exit code 1 when
it is stuck.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import requests
import tritonclient.grpc as grpcclient

from tritonforge.bench.reliability.clients import Clients, GrpcStream, grpc_request
from tritonforge.launch.launcher import TritonServer

MODEL = "ensemble_vllm"


async def send(server: TritonServer, count: int, cancel_at_end: bool) -> list[bool]:
    clients = Clients.open(server, 4)
    try:
        oks = []
        for i in range(count):
            inputs: dict[str, str | bytes | bool] = {
                "text_input": f"{i}. Hello",
                "sampling_parameters": json.dumps({"max_tokens": 8, "temperature": 0}),
                "stream": i % 2 == 0,
            }
            stream = GrpcStream(clients.channel(), grpc_request(MODEL, inputs))
            oks.append((await stream.run("repro", 120, cancel_at_end=cancel_at_end)).ok)
        return oks
    finally:
        await clients.close()


def state(http_url: str) -> str:
    index = requests.post(f"http://{http_url}/v2/repository/index", timeout=10).json()
    return next((m.get("state", "") for m in index if m["name"] == MODEL), "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--polite", action="store_true", help="half-close instead of cancel")
    parser.add_argument("--requests", type=int, default=4)
    args = parser.parse_args()
    log = Path(tempfile.gettempdir()) / "repro_cancel_after_final.log"
    server = TritonServer.on_free_ports(
        models=["vllm_model", "preprocessing", "postprocessing", MODEL], log_path=log
    )
    server.start()
    try:
        server.wait_ready()
        oks = asyncio.run(send(server, args.requests, cancel_at_end=not args.polite))
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            client.unload_model(MODEL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and state(server.http_url) != "UNAVAILABLE":
            time.sleep(0.5)
        found = state(server.http_url)
        how = "half-closed" if args.polite else "cancelled at FINAL"
        print(f"{sum(oks)}/{len(oks)} requests ok, calls {how} -> {MODEL} {found} after unload")
        return 0 if found == "UNAVAILABLE" else 1
    finally:
        server.stop(timeout_s=40)


if __name__ == "__main__":
    raise SystemExit(main())
