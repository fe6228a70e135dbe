"""CPU seconds per process while 8 concurrent chat requests x 32 tokens go through the
OpenAI frontend, then the same straight to Triton's gRPC stream (perf_analyzer both times).

Run by hand after the 21:01 run, from the repository root on the same quiet machine:
``.venv/bin/python perf/results/openai/20261201T210128Z/frontend_cpu/measure.py``.
"engine" is vLLM's EngineCore and worker processes under the stub. output.txt came from
the first draft of this script (the same steps and requests); this file is that draft
tidied for the linter.
"""

import json
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from tritonforge.bench.perf_analyzer_driver import chat_messages
from tritonforge.bench.services import TritonService
from tritonforge.bench.tools import tool_binary

OUT = Path(tempfile.gettempdir()) / "frontend-cpu"
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf"]
WORDS += ["hotel", "india", "juliet", "kilo", "lima", "mike"]
PARAMS = {"max_tokens": 32, "temperature": 0.0, "ignore_eos": True}


def prompts(tag: str) -> list[str]:
    return [
        f"{tag} {i}. " + " ".join(WORDS[(i + j) % len(WORDS)] for j in range(40)) for i in range(8)
    ]


def cpu(procs: dict[str, list[psutil.Process]]) -> dict[str, float]:
    return {
        name: sum(p.cpu_times().user + p.cpu_times().system for p in ps)
        for name, ps in procs.items()
    }


def main() -> None:
    OUT.mkdir(exist_ok=True)
    service = TritonService(models=["vllm_model"], log_path=OUT / "tritonserver.log", openai=True)
    service.start()
    service.wait_ready()
    try:
        assert service.server.process is not None and service.frontend is not None
        assert service.frontend.process is not None
        server = psutil.Process(service.server.process.pid)
        tree = server.children(recursive=True)
        front = psutil.Process(service.frontend.process.pid)
        procs = {
            "frontend": [front, *front.children(recursive=True)],
            "tritonserver": [server],
            "stub": [p for p in tree if "stub" in " ".join(p.cmdline())],
            "engine": [p for p in tree if "stub" not in " ".join(p.cmdline())],
        }
        host_port = service.frontend.base_url.removeprefix("http://").removesuffix("/v1")
        for kind in ["openai", "grpc", "openai", "grpc"]:
            batch = prompts(f"{kind}{time.time()}")
            if kind == "openai":
                body = {"model": "vllm_model", "stream": True}
                body |= {"stream_options": {"include_usage": True}} | PARAMS
                entries = [
                    {"payload": [body | {"messages": [{"role": "user", "content": p}]}]}
                    for p in batch
                ]
                protocol = ["--service-kind", "openai", "--endpoint", "v1/chat/completions"]
                protocol += ["-i", "http", "--async", "-u", host_port]
            else:
                entries = [
                    {
                        "messages": [chat_messages(p)],
                        "stream": [True],
                        "exclude_input_in_output": [True],
                        "sampling_parameters": [json.dumps(PARAMS)],
                        "return_num_output_tokens": [True],
                    }
                    for p in batch
                ]
                protocol = ["-i", "grpc", "--streaming", "-u", service.server.grpc_url]
            (OUT / "input.json").write_text(json.dumps({"data": entries}))
            before, started = cpu(procs), time.time()
            subprocess.run(
                [
                    str(tool_binary("perf_analyzer")),
                    *("-m", "vllm_model", *protocol, "--input-data", str(OUT / "input.json")),
                    *("--concurrency-range", "8:8", "--request-count", "8", "-s", "50"),
                ],
                capture_output=True,
                timeout=600,
                check=True,
            )
            after = cpu(procs)
            used = {k: round(after[k] - before[k], 2) for k in after}
            print(kind, f"{time.time() - started:.1f}s", used, flush=True)
    finally:
        service.stop()


if __name__ == "__main__":
    main()
