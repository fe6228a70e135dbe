"""A/B: a one-token decode step and a 50-token prompt on a one-sequence context (as the
replaced engine had) vs the 8-slot serving context, interleaved in one process.

    .venv/bin/python perf/results/llamacpp/20261202T140949Z/context_ab.py
"""

import statistics
import time

import llama_cpp as lc

from tritonforge.launch.model_store import gguf_path

lc.llama_backend_init()
MODEL = lc.llama_model_load_from_file(str(gguf_path()).encode(), lc.llama_model_default_params())
BATCH = lc.llama_batch_init(512, 0, 1)


def context(n_ctx: int, sequences: int):
    params = lc.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, 512, 512
    params.n_seq_max, params.n_threads, params.n_threads_batch = sequences, 1, 1
    return lc.llama_init_from_model(MODEL, params)


def decode(ctx, tokens: list[int], start: int) -> float:
    BATCH.n_tokens = len(tokens)
    for i, token in enumerate(tokens):
        BATCH.token[i], BATCH.pos[i], BATCH.n_seq_id[i] = token, start + i, 1
        BATCH.seq_id[i][0], BATCH.logits[i] = 0, i == len(tokens) - 1
    began = time.perf_counter()
    assert lc.llama_decode(ctx, BATCH) == 0
    return time.perf_counter() - began


contexts = {"one": context(2048, 1), "eight": context(8 * 2048, 8)}
position = {name: 40 for name in contexts}
for ctx in contexts.values():
    decode(ctx, [100 + i for i in range(40)], 0)
steps: dict[str, list[float]] = {name: [] for name in contexts}
prompts: dict[str, list[int]] = {name: [] for name in contexts}
for round_ in range(40):
    for name, ctx in contexts.items():
        steps[name].append(decode(ctx, [100], position[name]))
        position[name] += 1
    if round_ % 8 == 0:
        for name, ctx in contexts.items():
            lc.llama_memory_seq_rm(lc.llama_get_memory(ctx), 0, 0, -1)
            prompts[name].append(round(decode(ctx, [100 + i for i in range(50)], 0) * 1000))
            position[name] = 50
medians = {name: round(statistics.median(v) * 1000, 2) for name, v in steps.items()}
print({"step_1_ms_median": medians, "prompt_50_ms": prompts})
