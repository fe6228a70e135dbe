"""Make the project's LoRA adapters for SmolLM2 with ``peft``: seeded, local, never downloaded.

No registry ships a LoRA adapter for SmolLM2, and the hub is out of reach, so the
adapters that ``vllm_lora_model`` serves (and the tests use) are made here at setup
time: ``peft`` wraps the default model's ``q_proj``/``v_proj`` with rank-8 adapters
whose weights are drawn from a fixed seed, and saves them as a normal PEFT directory
(``adapter_config.json`` + ``adapter_model.safetensors``), the format vLLM and
``peft`` itself load. They are not trained: random weights are the cheapest adapter
that provably changes what the model says, which is what serving code must show.
peft's default initialisation sets ``lora_B`` to zero (an adapter that changes
nothing), so both matrices are drawn here, B scaled by :data:`B_SCALE` so the
greedy answer really moves.

llama.cpp reads adapters as GGUF: each directory also gets ``adapter.gguf``, written
here with the ``gguf`` package (:func:`write_gguf`) in the layout llama.cpp's own
``convert_lora_to_gguf.py`` produces for a llama model: ``general.type = adapter``,
``adapter.lora.alpha``, and per layer ``blk.<i>.attn_q.weight.lora_a`` / ``lora_b``, with
``q_proj``'s B rows permuted the way llama.cpp's converter permutes the base model's
``q_proj`` (the rotary layout), or the adapter would rotate the wrong dimensions.

Each adapter is built in a temporary sibling directory and renamed into place with a
marker naming its recipe, so an interrupted run is never taken for a finished one and
a changed recipe rebuilds it.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tritonforge.engines.lora import GGUF_ADAPTER_FILE
from tritonforge.launch.model_store import ensure_default_model, models_dir

MARKER = "tritonforge-adapter.json"
#: PEFT module name -> llama.cpp tensor name (llama architecture).
GGUF_NAMES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output"}
_PEFT_KEY = re.compile(r"layers\.(\d+)\.self_attn\.(\w+)\.lora_([AB])\.weight$")
TARGET_MODULES = ("q_proj", "v_proj")
RANK = 8
ALPHA = 16
#: Standard deviation of lora_B's entries: large enough that the greedy answer changes.
B_SCALE = 0.05


@dataclass(frozen=True)
class AdapterRecipe:
    """Everything an adapter's weights follow from; stored in its marker."""

    name: str
    seed: int
    rank: int = RANK
    alpha: int = ALPHA
    b_scale: float = B_SCALE
    target_modules: tuple[str, ...] = TARGET_MODULES


#: The adapters ``model_repository/vllm_lora_model/1/multi_lora.json`` lists.
RECIPES = (AdapterRecipe("smol-alpha", seed=1), AdapterRecipe("smol-beta", seed=2))


def adapters_dir() -> Path:
    """``$TRITONFORGE_MODELS/loras``: beside the model they adapt, under the clone's cache."""
    return models_dir() / "loras"


def _marker(recipe: AdapterRecipe, base: Path) -> dict[str, object]:
    return {
        "recipe": asdict(recipe) | {"target_modules": list(recipe.target_modules)},
        "base_model": base.name,
        "files": ["adapter_model.safetensors", GGUF_ADAPTER_FILE],
    }


def is_complete(target: Path, recipe: AdapterRecipe, base: Path) -> bool:
    marker = target / MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()) == _marker(recipe, base)
    except (OSError, json.JSONDecodeError):
        return False


def _rotary_permute(rows: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` of ``q_proj`` rows (HF rotary halves -> pairs)."""
    return (
        rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, *rows.shape[1:])
        .swapaxes(1, 2)
        .reshape(rows.shape)
    )


def write_gguf(adapter: Path, base: Path, target: Path) -> None:
    """Write the PEFT adapter at ``adapter`` (for the HF llama model ``base``) as a GGUF LoRA."""
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((adapter / "adapter_config.json").read_text())
    hf_config = json.loads((base / "config.json").read_text())
    n_head, n_kv = hf_config["num_attention_heads"], hf_config["num_key_value_heads"]
    writer = gguf.GGUFWriter(str(target), "llama")
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(config["lora_alpha"]))
    for key, weights in sorted(load_file(adapter / "adapter_model.safetensors").items()):
        match = _PEFT_KEY.search(key)
        if match is None or match.group(2) not in GGUF_NAMES:
            raise ValueError(f"{adapter}: no llama.cpp tensor for {key}")
        layer, module, half = int(match.group(1)), match.group(2), match.group(3)
        tensor = weights.astype(np.float32)
        if half == "B" and module in ("q_proj", "k_proj"):
            tensor = _rotary_permute(tensor, n_head if module == "q_proj" else n_kv)
        name = f"blk.{layer}.{GGUF_NAMES[module]}.weight.lora_{half.lower()}"
        writer.add_tensor(name, np.ascontiguousarray(tensor))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def build(recipe: AdapterRecipe, base: Path, target: Path) -> None:
    """Make one adapter for the model at ``base`` and save it at ``target`` (atomically)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    config = LoraConfig(
        r=recipe.rank,
        lora_alpha=recipe.alpha,
        target_modules=list(recipe.target_modules),
        lora_dropout=0.0,
        bias="none",
        init_lora_weights=False,
    )
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(recipe.seed)
    with torch.no_grad():
        for name, parameter in sorted(peft_model.named_parameters()):
            if ".lora_A." in name:
                bound = 1.0 / parameter.shape[1] ** 0.5
                parameter.copy_((torch.rand(parameter.shape, generator=generator) * 2 - 1) * bound)
            elif ".lora_B." in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * recipe.b_scale)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        peft_model.save_pretrained(str(staging), safe_serialization=True)
        # The adapter names the base model by its path on this machine; a served copy
        # (another clone, a container) must not depend on that.
        config_file = staging / "adapter_config.json"
        adapter_config = json.loads(config_file.read_text())
        adapter_config["base_model_name_or_path"] = base.name
        config_file.write_text(json.dumps(adapter_config, indent=2))
        write_gguf(staging, base, staging / GGUF_ADAPTER_FILE)
        (staging / MARKER).write_text(json.dumps(_marker(recipe, base)))
        staging.chmod(0o755)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def ensure_adapters(quiet: bool = False) -> dict[str, Path]:
    """The project's adapters by name, made on first use (and when their recipe changed)."""
    base = ensure_default_model(quiet=True)
    made = {}
    for recipe in RECIPES:
        target = adapters_dir() / recipe.name
        if not is_complete(target, recipe, base):
            build(recipe, base, target)
            print(f"adapter made: {target}", file=sys.stderr)
        elif not quiet:
            print(f"adapter ready: {target}", file=sys.stderr)
        made[recipe.name] = target
    return made


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    for name, path in ensure_adapters().items():
        print(f"{name}\t{path}")


if __name__ == "__main__":
    main()
