"""Tokenizers under test and the shared parity corpus (fixtures in the conftest.py files).

Used by the C++ module's parity and error tests (``tests/unit/tokenizer/test_tokenizer_*.py``) and
by the served tokenizer models' test (``tests/e2e/test_tokenizer_backend.py``).
Three families, so the exactness claim covers more than one BPE dialect: SmolLM2's own
tokenizer (the served model's), a GPT-2 style and a Llama-3 style byte-level BPE trained
here with HF ``tokenizers`` on the corpus's real text (a few seconds). Variants edit the
JSON to reach the options the trained files do not use: add_prefix_space, legacy "a b"
merges, ignore_merges with vocabulary entries no merge reaches, a BOS+EOS template, added
tokens with every flag.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    pre_tokenizers,
    processors,
    trainers,
)

from tests.tokenizer_corpus import build_corpus, real_text

try:  # the C++ module under test: its tests import it from here, to get this message
    import tritonforge_tokenizer as tt
except ImportError as exc:  # a missing build is a failure, never a silent skip
    raise ImportError("run scripts/build_tokenizer.sh to build the C++ tokenizer") from exc

__all__ = ["SMOLLM2", "build_tokenizer_files", "parity_corpus", "tt"]

REPO = Path(__file__).resolve().parents[1]
MODELS = Path(os.environ.get("TRITONFORGE_MODELS", REPO / ".cache" / "models"))
SMOLLM2 = MODELS / "SmolLM2-135M-Instruct" / "tokenizer.json"
CL100K = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    *[f"<|reserved_special_token_{i}|>" for i in range(4)],
]
GPT2_ADDED = ["<|endoftext|>", "<mask>", "[SEP]", "<sp>", " hello world", "token", "Ġraw"]
SMOLLM2_SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<file_sep>"]


def _training_text() -> list[str]:
    import random

    return real_text(3000, random.Random(7))


def _gpt2_style(texts: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=3000,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.add_special_tokens(
        [
            AddedToken("<mask>", lstrip=True, special=True),
            AddedToken("[SEP]", rstrip=True, special=True),
            AddedToken("<sp>", lstrip=True, rstrip=True, single_word=True, special=True),
        ]
    )
    tokenizer.add_tokens(
        [
            AddedToken(" hello world", normalized=True),
            AddedToken("token", single_word=True),
            AddedToken("Ġraw", normalized=False),
        ]
    )
    return tokenizer


def _llama3_style(texts: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(CL100K), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=3000,
        special_tokens=LLAMA3_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    bos = tokenizer.token_to_id("<|begin_of_text|>")
    tokenizer.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)]
            ),
        ]
    )
    return tokenizer


def _edit(path: Path, target: Path, change: Callable[[dict], None]) -> Path:
    data = json.loads(path.read_text())
    change(data)
    target.write_text(json.dumps(data, ensure_ascii=False))
    return target


def _prefix_space_legacy_merges(data: dict) -> None:
    data["pre_tokenizer"]["add_prefix_space"] = True
    data["model"]["merges"] = [" ".join(pair) for pair in data["model"]["merges"]]
    eos = next(t["id"] for t in data["added_tokens"] if t["content"] == "<|endoftext|>")
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
        "special_tokens": {
            "<|endoftext|>": {"id": "<|endoftext|>", "ids": [eos], "tokens": ["<|endoftext|>"]}
        },
    }


def _ignore_merges(data: dict) -> None:
    """ignore_merges plus whole words that only a vocabulary lookup can produce."""
    model = data["model"]
    model["ignore_merges"] = True
    next_id = 1 + max(max(model["vocab"].values()), *(t["id"] for t in data["added_tokens"]))
    for word in ("Ġthe", "Ġhello", "Ġinternational", "Ġ123", "Ġthe\u0120"):
        if word not in model["vocab"]:
            model["vocab"][word] = next_id
            next_id += 1


def build_tokenizer_files(folder: Path) -> dict[str, Path]:
    """name -> tokenizer.json: the served SmolLM2 file and ones built here in ``folder``."""
    assert SMOLLM2.is_file(), f"{SMOLLM2} missing: run `python -m tritonforge.launch.model_store`"
    texts = _training_text()
    gpt2 = folder / "gpt2.json"
    _gpt2_style(texts).save(str(gpt2))
    llama3 = folder / "llama3.json"
    _llama3_style(texts).save(str(llama3))
    return {
        "smollm2": SMOLLM2,
        "gpt2": gpt2,
        "gpt2_prefix_legacy_merges": _edit(
            gpt2, folder / "gpt2b.json", _prefix_space_legacy_merges
        ),
        "llama3": llama3,
        "llama3_ignore_merges": _edit(llama3, folder / "llama3b.json", _ignore_merges),
    }


def parity_corpus() -> list[str]:
    """The parity corpus, with every tokenizer's special and added tokens glued in."""
    return build_corpus(SMOLLM2_SPECIALS + LLAMA3_SPECIALS + GPT2_ADDED)
