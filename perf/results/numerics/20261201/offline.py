import json, os, sys
from vllm import LLM, SamplingParams
if __name__ == "__main__":
    llm = LLM(model=sys.argv[1], dtype=os.environ.get("DT","bfloat16"), enforce_eager=True, max_model_len=2048,
              kv_cache_memory_bytes=1 << 30, max_num_batched_tokens=2048)
    sp = SamplingParams(temperature=0, max_tokens=48, logprobs=0)
    prompts = ["The three primary colours are", "Écris une phrase en français sur l'été:",
               "def fibonacci(n):", "Once upon a time", "An example phone number in the US is"]
    tok = llm.get_tokenizer()
    chat = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}], tokenize=False, add_generation_prompt=True)
    out = []
    for p in prompts + [{"prompt_token_ids": tok.encode(chat, add_special_tokens=False)}]:
        o = llm.generate([p], sp)[0].outputs[0]
        out.append({"text": o.text, "clp": o.cumulative_logprob})
    print("RESULT" + json.dumps({"env": {k: os.environ.get(k) for k in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS")}, "out": out}))
