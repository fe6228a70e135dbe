"""The tensors every LLM model of this project serves: one list, read by two users.

The Triton edge (``model.py`` here) adds them in auto-complete, so an upstream-style
``config.pbtxt`` (just ``backend: "vllm"``) works unchanged; the repository generator
(``tritonforge.repo``) writes them into the configs it generates. Plain data here, so the
generator can read it without Triton's python backend.
"""

from __future__ import annotations

from typing import Any

#: The BOOL request flags of the shared schema (upstream vllm_backend's names first).
BOOL_INPUTS = (
    "stream",
    "exclude_input_in_output",
    "return_finish_reason",
    "return_cumulative_logprob",
    "return_logprobs",
    "return_num_input_tokens",
    "return_num_output_tokens",
    "return_output_ids",
)

LLM_INPUTS: tuple[dict[str, Any], ...] = (
    {"name": "text_input", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
    {"name": "messages", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
    {"name": "input_ids", "data_type": "TYPE_INT32", "dims": [-1], "optional": True},
    {"name": "sampling_parameters", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
    # The LoRA adapter to answer with (upstream vllm_backend's name; see tritonforge.engines.lora).
    {"name": "lora_name", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
    # Load, unload or list adapters at run time (see tritonforge.serving.lora_control).
    {"name": "lora_control", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
    {"name": "lora_path", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
    *({"name": n, "data_type": "TYPE_BOOL", "dims": [1], "optional": True} for n in BOOL_INPUTS),
)
LLM_OUTPUTS: tuple[dict[str, Any], ...] = (
    {"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "finish_reason", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "cumulative_logprob", "data_type": "TYPE_FP32", "dims": [-1]},
    {"name": "logprobs", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "num_input_tokens", "data_type": "TYPE_UINT32", "dims": [1]},
    {"name": "num_output_tokens", "data_type": "TYPE_UINT32", "dims": [-1]},
    {"name": "output_ids", "data_type": "TYPE_INT32", "dims": [-1]},
)
