"""A malformed request five times a second over one transport, each timed by the client.

    .venv/bin/python probe_transports.py {sse|gen|grpc} PORT SECONDS OUT

sse: HTTP generate_stream; gen: HTTP generate; grpc: a gRPC stream. Each writes
"<unix time sent> <unix time the final answer was read>" per request. The parameter
overload_probe_<transport> is unknown, so the model refuses it in execute().
"""

import http.client
import json
import queue
import sys
import time


def main() -> None:
    mode, port, seconds, path = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    key = f"overload_probe_{mode}"
    end = time.time() + seconds
    with open(path, "w") as out:
        if mode == "grpc":
            import numpy as np
            import tritonclient.grpc as grpc

            client = grpc.InferenceServerClient(f"127.0.0.1:{port}")
            answers: queue.Queue = queue.Queue()
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            while time.time() < end:
                text = grpc.InferInput("text_input", [1], "BYTES")
                text.set_data_from_numpy(np.array([b"probe"], dtype=object))
                sent = time.time()
                client.async_stream_infer(
                    "vllm_model_on", [text], parameters={key: 1}, enable_empty_final_response=True
                )
                while True:
                    result, error = answers.get()
                    final = result and result.get_response().parameters.get("triton_final_response")
                    if error is not None or (final and final.bool_param):
                        break
                out.write(f"{sent:.6f} {time.time():.6f}\n")
                time.sleep(0.2)
            client.stop_stream()
            return
        endpoint = "generate_stream" if mode == "sse" else "generate"
        body = json.dumps({"text_input": "probe", "parameters": {key: 1}})
        while time.time() < end:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            sent = time.time()
            connection.request(
                "POST",
                f"/v2/models/vllm_model_on/{endpoint}",
                body,
                {"Content-Type": "application/json"},
            )
            connection.getresponse().read()
            out.write(f"{sent:.6f} {time.time():.6f}\n")
            connection.close()
            time.sleep(0.2)


if __name__ == "__main__":
    main()
