"""Generate the C++ tokenizer's Unicode tables by probing the installed HF ``tokenizers``.

Why probe instead of using ICU/PCRE2/Python's ``unicodedata``: exact parity means
classifying every code point the way *this* ``tokenizers`` build does, and its regex
engines (Oniguruma for the pre-tokenizer patterns, Rust ``regex`` for added-token word
and whitespace checks) carry their own Unicode versions. So every class is read back
from ``tokenizers`` itself, through the very pre-tokenizers the C++ code reimplements:

* ``gpt2`` — ``ByteLevel(use_regex=True)``'s built-in pattern,
* ``cl100k`` — ``Split`` with the Llama-3 (tiktoken cl100k) pattern,

giving letter / number / whitespace sets per family (the fourth class, "other", is the
complement), the case-insensitive contraction letters of the cl100k pattern, and the
``\\w`` / ``\\s`` sets the added-token matcher uses for ``single_word`` / ``lstrip`` /
``rstrip``.

Run ``python scripts/gen_unicode_tables.py`` to rewrite the table; ``--check`` exits
non-zero when the committed file differs from a fresh generation (a test runs it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, models
from tokenizers.pre_tokenizers import ByteLevel, Split

OUTPUT = (
    Path(__file__).resolve().parent.parent
    / "backends"
    / "tokenizer"
    / "core"
    / "src"
    / "unicode_tables.cpp"
)

CL100K_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
MAX_CODEPOINT = 0x10FFFF
CODEPOINTS = [c for c in range(MAX_CODEPOINT + 1) if not 0xD800 <= c <= 0xDFFF]

Offsets = list[tuple[int, int]]
Splitter = Callable[[str], Offsets]


def _splitter(pre_tokenizer: ByteLevel | Split) -> Splitter:
    """Char offsets of the pieces a pre-tokenizer cuts ``text`` into."""
    return lambda text: [span for _, span in pre_tokenizer.pre_tokenize_str(text)]


FAMILIES: dict[str, Splitter] = {
    "gpt2": _splitter(ByteLevel(add_prefix_space=False, use_regex=True)),
    "cl100k": _splitter(Split(Regex(CL100K_PATTERN), behavior="isolated")),
}

# Per family: (context before c, context after c, class) — c joins the piece holding the
# context's last char exactly when it belongs to the class. The contexts start with a
# char that ends whatever piece the previous probe left open, so probes can be chained
# into one string (one call into tokenizers instead of a million).
JOIN_PROBES: dict[str, list[tuple[str, str]]] = {
    "gpt2": [(" a", "letter"), (" 1", "number"), (" !", "other")],
    "cl100k": [("1a", "letter"), ("a1", "number"), ("a1!", "other_letter_newline")],
}


def _boundaries(offsets: Offsets) -> set[int]:
    return {start for start, _ in offsets}


def _probe_join(split: Splitter, prefix: str, chars: list[int], suffix: str = "") -> set[int]:
    """Chars that stay in one piece with the prefix's last char."""
    unit = len(prefix) + 1 + len(suffix)
    text = "".join(prefix + chr(c) + suffix for c in chars)
    starts = _boundaries(split(text))
    return {c for i, c in enumerate(chars) if i * unit + len(prefix) not in starts}


def _probe_cut_after(split: Splitter, prefix: str, chars: list[int], suffix: str) -> set[int]:
    """Chars after which (plus ``suffix[:-1]``) a new piece starts at the suffix's last char."""
    unit = len(prefix) + 1 + len(suffix)
    text = "".join(prefix + chr(c) + suffix for c in chars)
    starts = _boundaries(split(text))
    return {c for i, c in enumerate(chars) if (i + 1) * unit - 1 in starts}


def classify(family: str) -> dict[str, set[int]]:
    """Letter/number/whitespace sets of one pre-tokenizer family.

    Probing all 1.1 M code points one by one costs seconds per class, so the code
    points are first run through the pre-tokenizer in order: every piece is one class
    run, except that its first char may be a prefix of another class. Only the first,
    second and last char of each piece (and all of Latin-1) are probed individually;
    the rest of a piece takes its second char's class, checked against its last char.
    """
    split = FAMILIES[family]
    ordered = "".join(chr(c) for c in CODEPOINTS)
    pieces = split(ordered)
    reps: set[int] = set(range(0x100))
    for start, end in pieces:
        reps.update(CODEPOINTS[i] for i in {start, min(start + 1, end - 1), end - 1})
    probe_chars = sorted(reps)
    joined = {cls: _probe_join(split, prefix, probe_chars) for prefix, cls in JOIN_PROBES[family]}
    if family == "cl100k":
        # "!" + letter joins via the optional prefix of the letters alternative, and
        # "!" + CR/LF via the trailing [\r\n]* of the punctuation alternative.
        joined["other"] = joined.pop("other_letter_newline") - joined["letter"] - {0x0A, 0x0D}
    rep_class: dict[int, str] = {}
    for c in probe_chars:
        found = [cls for cls in ("letter", "number", "other") if c in joined[cls]]
        if len(found) > 1:
            raise SystemExit(f"{family}: U+{c:04X} probes as several classes {found}")
        rep_class[c] = found[0] if found else "space"
    classes: dict[str, set[int]] = {"letter": set(), "number": set(), "space": set()}
    for start, end in pieces:
        body = rep_class[CODEPOINTS[min(start + 1, end - 1)]]
        if rep_class[CODEPOINTS[end - 1]] != body:
            raise SystemExit(f"{family}: piece {start}..{end} is not one class run")
        for i in range(start, end):
            c = CODEPOINTS[i]
            cls = rep_class.get(c, body)
            if cls != "other":
                classes[cls].add(c)
    for required, cls in ((0x0A, "space"), (0x0D, "space"), (0x20, "space")):
        if required not in classes[cls]:
            raise SystemExit(f"{family}: U+{required:04X} is expected to be {cls}")
    return classes


def contraction_letters(letters: set[int]) -> dict[str, set[int]]:
    """Letters the cl100k pattern's case-insensitive ``'s|'t|'re|'ve|'m|'ll|'d`` accepts.

    Only letters whose Unicode case mappings touch one of those letters can fold to
    them, so only those are probed (a few dozen), through the real pattern.
    """
    split = FAMILIES["cl100k"]
    wanted = set("strvemdlSTRVEMDL")
    candidates = sorted(
        c
        for c in letters
        if wanted & set(chr(c).lower() + chr(c).upper() + chr(c).casefold() + chr(c))
    )
    sets = {
        # "'" + c + "b": a contraction ends before "b"; letters would run on.
        "single": _probe_cut_after(split, "1'", candidates, "b"),
        "r_or_v": _probe_cut_after(split, "1'", candidates, "eb"),
        "e": _probe_cut_after(split, "1'r", candidates, "b"),
        "l_first": _probe_cut_after(split, "1'", candidates, "lb"),
        "l_second": _probe_cut_after(split, "1'l", candidates, "b"),
    }
    if sets["l_first"] != sets["l_second"]:
        raise SystemExit("cl100k: 'll contraction letters differ by position")
    sets["l"] = sets.pop("l_first") & sets.pop("l_second")
    for name, ascii_letters in (
        ("single", "stmdSTMD"),
        ("r_or_v", "rvRV"),
        ("e", "eE"),
        ("l", "lL"),
    ):
        if not {ord(x) for x in ascii_letters} <= sets[name]:
            raise SystemExit(f"cl100k: contraction set {name} lacks {ascii_letters}")
    return sets


def _probe_added_token(token: AddedToken, text_of: Callable[[int], str]) -> Offsets:
    """Offsets of ``token`` matches in one probe string per code point (in 4 chunks)."""
    tokenizer = Tokenizer(models.BPE(vocab={}, merges=[]))
    tokenizer.add_tokens([token])
    chunks = [CODEPOINTS[i::4] for i in range(4)]
    encodings = tokenizer.encode_batch(
        ["".join(text_of(c) for c in chunk) for chunk in chunks], add_special_tokens=False
    )
    result = []
    for chunk, encoding in zip(chunks, encodings, strict=True):
        result.extend((chunk[start // 3], end - start) for start, end in encoding.offsets)
    return result


def added_token_classes() -> dict[str, set[int]]:
    """``\\w`` (single_word) and ``\\s`` (lstrip/rstrip) of the added-token matcher."""
    # c + TOK + "\x02": a single_word TOK matches only when c is not a word char.
    matched = _probe_added_token(
        AddedToken("\x01", single_word=True, normalized=False), lambda c: chr(c) + "\x01\x02"
    )
    non_word = {c for c, _ in matched}
    # "\x02" + c + TOK: an lstrip TOK swallows c exactly when c is whitespace.
    stripped = _probe_added_token(
        AddedToken("\x01", lstrip=True, normalized=False), lambda c: "\x02" + chr(c) + "\x01"
    )
    return {
        "word": set(CODEPOINTS) - non_word,
        "strip_space": {c for c, length in stripped if length == 2},
    }


def ranges(codepoints: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted inclusive ranges; surrogates (never in valid UTF-8) may be bridged."""
    result: list[list[int]] = []
    for c in sorted(codepoints):
        if result and (c == result[-1][1] + 1 or (result[-1][1] == 0xD7FF and c == 0xE000)):
            result[-1][1] = c
        else:
            result.append([c, c])
    return [(lo, hi) for lo, hi in result]


def _rows(spans: list[tuple[int, int]]) -> list[str]:
    """The ranges as C++ initialisers, six to a line."""
    cells = [f"{{0x{lo:X}, 0x{hi:X}}}," for lo, hi in spans]
    return ["    " + " ".join(cells[i : i + 6]) for i in range(0, len(cells), 6)]


def render(tables: dict[str, set[int]]) -> str:
    lines = [
        f"// Generated by scripts/gen_unicode_tables.py from tokenizers {tokenizers.__version__}.",
        "// Do not edit: regenerate, and the parity tests tell whether the C++ still agrees.",
        '#include "unicode_tables.h"',
        "",
        "namespace tritonforge_tokenizer::unicode_tables {",
        "",
    ]
    first_of: dict[frozenset[int], str] = {}
    for name, codepoints in tables.items():
        spans = ranges(codepoints)
        # A class that two families define alike (gpt2's and cl100k's letters) is stored
        # once; the second name points at the first one's ranges.
        same = first_of.setdefault(frozenset(codepoints), name)
        if same != name:
            lines.append(f"// the same code points as {same}")
        else:
            lines.append(f"// {len(codepoints)} code points")
            lines.append(f"static const CodepointRange {name}_ranges[] = {{")
            lines += _rows(spans)
            lines.append("};")
        lines.append(f"const CodepointRange* const {name} = {same}_ranges;")
        lines.append(f"const std::size_t {name}_size = {len(spans)};")
        lines.append("")
    lines.append("}  // namespace tritonforge_tokenizer::unicode_tables")
    return "\n".join(lines) + "\n"


def generate() -> str:
    """The full C++ source text of the tables (deterministic for one tokenizers build)."""
    tables: dict[str, set[int]] = {}
    for family in FAMILIES:
        for cls, codepoints in classify(family).items():
            tables[f"{family}_{cls}"] = codepoints
    for name, codepoints in contraction_letters(tables["cl100k_letter"]).items():
        tables[f"cl100k_contraction_{name}"] = codepoints
    for name, codepoints in added_token_classes().items():
        tables[f"added_{name}"] = codepoints
    return render(tables)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    text = generate()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run scripts/gen_unicode_tables.py", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
