"""Does the OpenAI frontend add TTFT over Triton's gRPC stream, or did the client tools?

Run from the repository root with ``.venv/bin/python``. One tritonserver with
``vllm_model`` and ``python -m tritonforge.openai`` in front of it (as ``make serve``
runs them). Two ways to the same model, both through the chat template:

- ``grpc``: one long-lived tritonclient gRPC stream, the ``messages`` input;
- ``openai``: one long-lived ``requests`` session, streamed ``/v1/chat/completions``.

Interleaved rounds, order swapped each round; in each, ``PER`` requests at concurrency 1,
a ~40-word user message, 32 forced tokens, greedy. Per request: TTFT (the request sent →
the first response carrying text) and the mean gap between token-bearing responses. Around
the ``openai`` condition the frontend's own CPU time is read from ``/proc``, and
tritonserver's process group's around both, so the frontend's cost per request shows
beside what it adds to the clock.

Both clients run in this one Python process on the same two cores as the servers; the
perf_analyzer runs of perf/results/openai used two different clients (its gRPC and its
OpenAI HTTP modes), which is the difference this run removes.
"""

from __future__ import annotations

import json
import os
import queue
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import psutil
import requests
import tritonclient.grpc as grpcclient

from tests.e2e.client import llm_inputs
from tritonforge.launch.launcher import OpenAIFrontend, TritonServer

WORDS = "river stone cloud paper lamp garden window music planet forest silver bridge".split()  # noqa: SIM905
ROUNDS, PER = int(os.environ.get("ROUNDS", 6)), int(os.environ.get("PER", 3))
TOKENS = 32
OUT = Path(__file__).resolve().parent


def message(rng: random.Random) -> list[dict]:
    text = " ".join(rng.choice(WORDS) for _ in range(40))
    return [{"role": "user", "content": f"Write a short story using these words: {text}"}]


class Grpc:
    """A persistent gRPC stream, one request at a time (as perf_analyzer keeps one)."""

    def __init__(self, url: str) -> None:
        self.events: queue.Queue = queue.Queue()
        self.client = grpcclient.InferenceServerClient(url)
        self.client.start_stream(callback=lambda result, error: self.events.put((result, error)))

    def one(self, messages: list[dict]) -> tuple[float, float, int]:
        sampling = {"temperature": 0, "max_tokens": TOKENS, "ignore_eos": True}
        inputs = llm_inputs(sampling=sampling, messages=messages)
        arrivals: list[float] = []
        sent = time.perf_counter()
        self.client.async_stream_infer("vllm_model", inputs, enable_empty_final_response=True)
        while True:
            result, error = self.events.get(timeout=300)
            assert error is None, error
            now = time.perf_counter()
            response = result.get_response()
            if response.outputs and result.as_numpy("text_output")[0]:
                arrivals.append(now)
            final = response.parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                break
        return arrivals[0] - sent, gap(arrivals), len(arrivals)

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


class OpenAI:
    """A persistent HTTP session to the frontend, streamed chat completions."""

    def __init__(self, base_url: str) -> None:
        self.url = f"{base_url}/chat/completions"
        self.session = requests.Session()

    def one(self, messages: list[dict]) -> tuple[float, float, int]:
        body = {
            "model": "vllm_model",
            "messages": messages,
            "max_tokens": TOKENS,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        arrivals: list[float] = []
        sent = time.perf_counter()
        with self.session.post(self.url, json=body, stream=True, timeout=300) as reply:
            reply.raise_for_status()
            for line in reply.iter_lines():
                if line.startswith(b"data: {"):
                    choices = json.loads(line[6:])["choices"]
                    if choices and choices[0]["delta"].get("content"):
                        arrivals.append(time.perf_counter())
        return arrivals[0] - sent, gap(arrivals), len(arrivals)


def gap(arrivals: list[float]) -> float:
    return (arrivals[-1] - arrivals[0]) / max(1, len(arrivals) - 1)


def cpu_s(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def measure_rounds(clients: dict, front: list, server: list, rng: random.Random) -> list[dict]:
    """ROUNDS interleaved rounds of PER requests a client, the order swapped each round."""
    rows = []
    for r in range(ROUNDS):
        order = list(clients) if r % 2 == 0 else list(reversed(clients))
        for name in order:
            before = cpu_s(front), cpu_s(server)
            runs = [clients[name].one(message(rng)) for _ in range(PER)]
            after = cpu_s(front), cpu_s(server)
            tokens = sum(n for *_, n in runs)
            row = {
                "round": r,
                "target": name,
                "ttft_ms": [round(t * 1000, 1) for t, _, _ in runs],
                "gap_ms": [round(g * 1000, 2) for _, g, _ in runs],
                "tokens": tokens,
                "frontend_cpu_ms_per_token": round((after[0] - before[0]) * 1000 / tokens, 3),
                "triton_cpu_ms_per_token": round((after[1] - before[1]) * 1000 / tokens, 3),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def paired_rounds(rows: list[dict]) -> list[dict]:
    """Per round: the frontend's TTFT p50 minus gRPC's, and the ratio of their gaps."""
    paired = []
    for r in range(ROUNDS):
        by = {row["target"]: row for row in rows if row["round"] == r}
        paired.append(
            {
                "round": r,
                "ttft_p50_delta_ms": round(
                    statistics.median(by["openai"]["ttft_ms"])
                    - statistics.median(by["grpc"]["ttft_ms"]),
                    1,
                ),
                "gap_ratio": round(
                    statistics.median(by["openai"]["gap_ms"])
                    / statistics.median(by["grpc"]["gap_ms"]),
                    3,
                ),
            }
        )
    return paired


def main() -> None:
    rng = random.Random(11)
    with TritonServer.on_free_ports(models=["vllm_model"]) as triton:
        frontend = OpenAIFrontend.on_free_port(triton.grpc_url)
        frontend.start()
        try:
            frontend.wait_ready()
            front = [psutil.Process(frontend.process.pid)]
            server = triton.group_processes()
            clients = {"grpc": Grpc(triton.grpc_url), "openai": OpenAI(frontend.base_url)}
            for client in clients.values():  # warm-up
                for _ in range(2):
                    client.one(message(rng))
            rows = measure_rounds(clients, front, server, rng)
            clients["grpc"].close()
        finally:
            frontend.stop()
    paired = paired_rounds(rows)
    summary = {
        "ttft_p50_delta_ms": [p["ttft_p50_delta_ms"] for p in paired],
        "gap_ratio": [p["gap_ratio"] for p in paired],
        "frontend_cpu_ms_per_token": statistics.median(
            row["frontend_cpu_ms_per_token"] for row in rows if row["target"] == "openai"
        ),
    }
    print(json.dumps(summary, indent=1))
    (OUT / "output.json").write_text(json.dumps({"rows": rows, "paired": paired}, indent=1))


if __name__ == "__main__":
    main()
