"""The parity corpus: real text from files every Python install carries, plus seeded fuzz.

Why these sources: the machine has no network and no dataset package, but the Python
standard library ships real English prose and code (its own sources) and real Chinese,
Japanese and Korean text (``test/cjkencodings/*-utf8.txt``); site-packages adds Markdown
docs. The fuzz targets what byte-level tokenizers get wrong: Unicode classes at their
edges, emoji ZWJ sequences, combining marks, RTL and bidi controls, control chars,
whitespace runs of every kind, digit runs, case-folded contractions and added-token
strings glued to text.
"""

from __future__ import annotations

import random
import sysconfig
from collections.abc import Iterator, Sequence
from pathlib import Path

SEED = 20261130

_BLOCKS: list[tuple[int, int]] = [
    (0x20, 0x7E),  # ASCII
    (0x00, 0x1F),  # C0 controls
    (0x7F, 0x9F),  # DEL, C1 controls
    (0xA0, 0x24F),  # Latin-1, Latin extended
    (0x300, 0x36F),  # combining diacritics
    (0x370, 0x3FF),  # Greek
    (0x400, 0x4FF),  # Cyrillic
    (0x590, 0x5FF),  # Hebrew
    (0x600, 0x6FF),  # Arabic (with Arabic-Indic digits)
    (0x900, 0x97F),  # Devanagari
    (0xE00, 0xE7F),  # Thai
    (0x1100, 0x11FF),  # Hangul Jamo
    (0x1680, 0x1680),  # Ogham space
    (0x2000, 0x206F),  # general punctuation: spaces, ZWJ, bidi controls
    (0x2150, 0x218F),  # number forms, roman numerals
    (0x2460, 0x24FF),  # enclosed alphanumerics
    (0x3000, 0x30FF),  # CJK punctuation, ideographic space, kana
    (0x4E00, 0x9FFF),  # CJK ideographs
    (0xAC00, 0xD7A3),  # Hangul syllables
    (0xFB00, 0xFB4F),  # presentation forms (ligatures)
    (0xFE00, 0xFE0F),  # variation selectors
    (0xFF00, 0xFFEF),  # fullwidth forms
    (0x10330, 0x1034F),  # Gothic (letters and a number letter)
    (0x1D400, 0x1D7FF),  # mathematical alphanumerics
    (0x1F300, 0x1FAFF),  # emoji
    (0xE0000, 0xE007F),  # tags
    (0x10000, 0x10FFFF),  # anything, mostly unassigned
]
_SPACES = [
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "\r",
    "\u3000",
    "\xa0",
    "\u2009",
    "\u200b",
    "\x0b",
    "\x0c",
]
_EMOJI = [
    "👨\u200d👩\u200d👧\u200d👦",
    "👩\u200d💻",
    "🏳️\u200d🌈",
    "👍🏽",
    "1️⃣",
    "🇫🇷🇯🇵",
    "❤️",
    "🧑🏿\u200d🦯",
]
_CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ll", "'ſ", "''"]
_WORDS = ["hello", "world", "Token", "naïve", "ÜBER", "日本語", "тест", "مرحبا", "שלום", "x", "I"]


def _codepoint(rng: random.Random) -> str:
    first, last = rng.choice(_BLOCKS)
    while True:
        cp = rng.randint(first, last)
        if not 0xD800 <= cp <= 0xDFFF:
            return chr(cp)


def _fuzz_one(rng: random.Random, specials: Sequence[str], words: Sequence[str]) -> str:
    parts: list[str] = []
    for _ in range(rng.randint(1, 12)):
        kind = rng.random()
        if kind < 0.25:
            parts.append("".join(_codepoint(rng) for _ in range(rng.randint(1, 8))))
        elif kind < 0.40:
            parts.append(rng.choice(words) if rng.random() < 0.7 else rng.choice(_WORDS))
        elif kind < 0.52:
            parts.append("".join(rng.choice(_SPACES) for _ in range(rng.randint(1, 40))))
        elif kind < 0.62:
            digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 30)))
            parts.append(
                rng.choice([digits, f"{digits},{digits[:3]}.5", "٣٤٥٦", "１２３", "²³", "Ⅻ"])
            )
        elif kind < 0.72:
            word = rng.choice(_WORDS)
            parts.append(word + rng.choice(_CONTRACTIONS) + rng.choice(["", " ", "x", "s"]))
        elif kind < 0.82:
            special = rng.choice(specials)
            if rng.random() < 0.15:
                special = special[: rng.randint(1, len(special))]  # a prefix, not a match
            pad = rng.choice(["", " ", "  ", "\n", "a", "\t "])
            parts.append(pad + special + rng.choice(["", " ", "  ", "\n", "b", " \t"]))
        elif kind < 0.90:
            parts.append(rng.choice(_EMOJI) * rng.randint(1, 3))
        elif kind < 0.95:
            base = rng.choice("aeoAEOنא")
            parts.append(
                base + "".join(chr(rng.randint(0x300, 0x36F)) for _ in range(rng.randint(1, 5)))
            )
        else:
            parts.append(
                rng.choice(["\u202ehello\u202c", "\u200f", "\u2066x\u2069", "\x00", "\x1b[0m"])
            )
        if rng.random() < 0.5:
            parts.append(rng.choice(_SPACES[:3]))
    return "".join(parts)


def _source_files() -> Iterator[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    yield from sorted((stdlib / "test" / "cjkencodings").glob("*-utf8.txt"))
    yield from sorted(stdlib.glob("*.py"))
    yield from sorted(Path(sysconfig.get_paths()["purelib"]).glob("*/*.md"))


def real_text(count: int, rng: random.Random) -> list[str]:
    """``count`` real snippets: single lines and multi-line blocks with their indentation."""
    lines: list[str] = []
    for path in _source_files():
        try:
            lines.extend(ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip())
        except (UnicodeDecodeError, OSError):
            continue
        if len(lines) > 60 * count:
            break
    samples = []
    for _ in range(count):
        start = rng.randrange(len(lines))
        samples.append("\n".join(lines[start : start + rng.choice([1, 1, 2, 4, 8])]))
    return samples


def build_corpus(specials: Sequence[str], real: int = 5000, fuzz: int = 6000) -> list[str]:
    """Deterministic corpus (same seed, same Python install: same strings)."""
    rng = random.Random(SEED)
    texts = real_text(real, rng)
    words = [w for text in texts[:500] for w in text.split()][:2000] or list(_WORDS)
    texts += [_fuzz_one(rng, specials, words) for _ in range(fuzz)]
    texts += ["", " ", "\n", "'s", " 's", "  x", "a\r\nb", "\t\t", "123456789", "ſ"]
    return texts
