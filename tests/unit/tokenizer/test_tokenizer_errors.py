"""Bad tokenizer files and bad input give errors that name the problem, never a crash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tokenizers_under_test import tt


@pytest.fixture(scope="module")
def smollm2_json(tokenizer_files: dict[str, Path]) -> dict:
    return json.loads(tokenizer_files["smollm2"].read_text())


def _load_error(data: dict) -> str:
    with pytest.raises(tt.TokenizerLoadError) as info:
        tt.Tokenizer.from_str(json.dumps(data))
    return str(info.value)


def test_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "tokenizer.json"
    with pytest.raises(tt.TokenizerLoadError, match=r"nope/tokenizer\.json' cannot be opened"):
        tt.Tokenizer.from_file(str(missing))


def test_invalid_json_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text('{"model": ')
    with pytest.raises(tt.TokenizerLoadError, match="not valid JSON"):
        tt.Tokenizer.from_file(str(path))
    with pytest.raises(tt.TokenizerLoadError, match="not a JSON object"):
        tt.Tokenizer.from_str("[1, 2]")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(normalizer={"type": "NFC"}), "normalizer 'NFC' is not supported"),
        (lambda d: d["model"].update(type="Unigram"), "model type 'Unigram' is not supported"),
        (lambda d: d["model"].update(dropout=0.1), "dropout is not supported"),
        (lambda d: d["model"].update(byte_fallback=True), "byte_fallback is not supported"),
        (
            lambda d: d.update(pre_tokenizer={"type": "Metaspace", "replacement": "▁"}),
            "pre-tokenizer 'Metaspace' is not supported",
        ),
        (
            lambda d: d.update(
                pre_tokenizer={
                    "type": "Sequence",
                    "pretokenizers": [
                        {"type": "Split", "pattern": {"Regex": "\\d+"}, "behavior": "Isolated"},
                        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
                    ],
                }
            ),
            r'Split regex "\\d+" is not supported',
        ),
        (lambda d: d.update(pre_tokenizer=None), "a ByteLevel pre_tokenizer is required"),
        (lambda d: d.update(decoder={"type": "WordPiece"}), "decoder 'WordPiece' is not supported"),
        (lambda d: d.update(truncation={"max_length": 8}), "truncation is not supported"),
        (
            lambda d: d["model"]["merges"].append(["Ġzzzq", "x"]),
            "token 'Ġzzzq' is not in the vocabulary",
        ),
        (
            lambda d: d["model"].update(unk_token="<nope>"),
            "unk_token '<nope>' is not in the vocabulary",
        ),
        (
            lambda d: d.update(post_processor={"type": "Whatever"}),
            "post-processor 'Whatever' is not supported",
        ),
    ],
)
def test_unsupported_components_are_named(smollm2_json: dict, change, message: str) -> None:
    data = json.loads(json.dumps(smollm2_json))
    change(data)
    assert message in _load_error(data)


def test_bad_ids_are_named_and_leave_the_decoder_usable(tokenizer_files: dict[str, Path]) -> None:
    tokenizer = tt.Tokenizer.from_file(str(tokenizer_files["smollm2"]))
    size = tokenizer.vocab_size
    with pytest.raises(tt.TokenizerInputError, match=f"token id {size} is out of range"):
        tokenizer.decode([1, size])
    with pytest.raises(tt.TokenizerInputError, match="token id -1 is out of range"):
        tokenizer.decode([-1])
    decoder = tokenizer.incremental_decoder(skip_special_tokens=False)
    hello = tokenizer.encode("Hello")
    assert decoder.add(hello[0]) == "Hello"
    with pytest.raises(tt.TokenizerInputError):
        decoder.add(size + 5)
    assert decoder.add_many(tokenizer.encode(" world")) == " world"


def test_text_that_is_not_unicode_is_rejected(tokenizer_files: dict[str, Path]) -> None:
    tokenizer = tt.Tokenizer.from_file(str(tokenizer_files["smollm2"]))
    with pytest.raises(tt.TokenizerInputError, match="lone surrogate"):
        tokenizer.encode("lone surrogate \ud800")
    with pytest.raises(tt.TokenizerInputError, match="text 1 is not valid Unicode"):
        tokenizer.encode_batch(["fine", "bad \udfff"])
    assert tokenizer.encode("still fine") == tokenizer.encode("still fine")
