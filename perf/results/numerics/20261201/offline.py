"""The script behind results.json: offline vLLM greedy text under one setting.

Run as ``DT=float32 python offline.py <model dir>`` (``DT`` defaults to bfloat16), with
the variable under test (ONEDNN_MAX_CPU_ISA, OMP_NUM_THREADS, ...) set in the environment.
"""

import json
import os
import sys

from vllm import LLM, SamplingParams

PROMPTS = [
    "The three primary colours are",
    "Écris une phrase en français sur l'été:",
    "def fibonacci(n):",
    "Once upon a time",
    "An example phone number in the US is",
]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
WATCHED = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS")

if __name__ == "__main__":
    llm = LLM(
        model=sys.argv[1],
        dtype=os.environ.get("DT", "bfloat16"),
        enforce_eager=True,
        max_model_len=2048,
        kv_cache_memory_bytes=1 << 30,
        max_num_batched_tokens=2048,
    )
    greedy = SamplingParams(temperature=0, max_tokens=48, logprobs=0)
    tokenizer = llm.get_tokenizer()
    chat = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    inputs = [*PROMPTS, {"prompt_token_ids": tokenizer.encode(chat, add_special_tokens=False)}]
    out = []
    for prompt in inputs:
        completion = llm.generate([prompt], greedy)[0].outputs[0]
        out.append({"text": completion.text, "clp": completion.cumulative_logprob})
    env = {k: os.environ.get(k) for k in WATCHED}
    print("RESULT" + json.dumps({"env": env, "out": out}))
