"""Deterministic PII detection and redaction: e-mail, phone, payment card, IBAN.

Each detector is a candidate pattern (the *shape* of the secret) plus a validator (the
rule a real one satisfies: Luhn for cards, ISO 7064 mod 97-10 for IBANs). Shapes are
deliberately greedy — a run of digit groups, a run of IBAN groups — and the validator
then tries the run and its group-aligned prefixes, so a secret followed by an unrelated
number ("4111 1111 1111 1111 2025") is still found. Patterns and their false-positive
trade-offs are documented in docs/guard.md.

:class:`StreamGuard` applies the same detectors to streamed text. It releases text as
soon as no pattern could still match across the cut: the ``regex`` module's partial
matching tells, for every detector, whether the tail of the buffer could be the start
of a secret, and only that tail is held back. A secret split across two chunks is
therefore caught, while ordinary prose is delayed by at most the word being written.

Offsets are Python string indices (Unicode code points) into the unredacted text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import regex

PLACEHOLDERS = {"email": "[EMAIL]", "phone": "[PHONE]", "card": "[CARD]", "iban": "[IBAN]"}


@dataclass(frozen=True)
class Finding:
    """One detected secret: its type and its span in the text the guard was given."""

    type: str
    start: int
    end: int


def findings_json(findings: list[Finding]) -> str:
    """The wire form: a JSON list of ``{"type", "start", "end"}`` objects."""
    return json.dumps([asdict(f) for f in findings])


# --- validators ---------------------------------------------------------------


def luhn_valid(digits: str) -> bool:
    """The Luhn checksum every payment card number carries in its last digit."""
    total = 0
    for i, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if i % 2 == 1:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def iban_valid(compact: str) -> bool:
    """ISO 13616: move the first four characters to the end, letters to 10..35, mod 97 == 1."""
    rearranged = compact[4:] + compact[:4]
    remainder = 0
    for char in rearranged:
        value = int(char, 36)  # '0'-'9' -> 0-9, 'A'-'Z' -> 10-35
        remainder = (remainder * (100 if value > 9 else 10) + value) % 97
    return remainder == 1


def _group_prefixes(text: str, separators: str) -> Iterator[str]:
    """``text``, then each shorter prefix that ends just before a separator."""
    yield text
    for i in range(len(text) - 1, 0, -1):
        if text[i] in separators:
            yield text[:i]


def _card_length(candidate: str) -> int | None:
    """Length of the longest card number at the start of a digit-group run, or None.

    Cards are 13-19 digits, start with 2-6 (the industries that issue payment cards),
    use one kind of separator throughout, and pass Luhn.
    """
    for prefix in _group_prefixes(candidate, " -"):
        separators = {c for c in prefix if not c.isdigit()}
        digits = "".join(c for c in prefix if c.isdigit())
        if (
            len(separators) <= 1
            and 13 <= len(digits) <= 19
            and digits[0] in "23456"
            and luhn_valid(digits)
        ):
            return len(prefix)
    return None


def _iban_length(candidate: str) -> int | None:
    """Length of the longest valid IBAN (15-34 characters, mod 97) at the run's start."""
    for prefix in _group_prefixes(candidate, " "):
        compact = prefix.replace(" ", "")
        if 15 <= len(compact) <= 34 and iban_valid(compact):
            return len(prefix)
    return None


def _phone_length(candidate: str) -> int | None:
    """International numbers need 8-15 digits (E.164); the NANP shape is fixed."""
    digits = sum(c.isdigit() for c in candidate)
    if candidate.startswith("+"):
        return len(candidate) if 8 <= digits <= 15 else None
    return len(candidate) if digits == 10 else None


def _email_length(candidate: str) -> int | None:
    """Dots may not start, end or double in the local part; labels not start/end with '-'."""
    local, _, domain = candidate.partition("@")
    if local.startswith(".") or local.endswith(".") or ".." in local:
        return None
    if any(label.startswith("-") or label.endswith("-") for label in domain.split(".")):
        return None
    return len(candidate)


# --- detectors ----------------------------------------------------------------


@dataclass(frozen=True)
class Detector:
    """A candidate shape and the validator that finds the real secret in it."""

    type: str
    pattern: regex.Pattern[str]
    valid_length: Callable[[str], int | None]


DETECTORS = (
    Detector(
        "email",
        regex.compile(
            r"(?<![\w.%+-])[A-Za-z0-9._%+-]{1,64}@(?:[A-Za-z0-9-]{1,63}\.)+[A-Za-z]{2,63}(?![\w-])"
        ),
        _email_length,
    ),
    Detector(
        "iban",
        regex.compile(r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,40}(?![A-Za-z0-9])"),
        _iban_length,
    ),
    Detector(
        "card",
        regex.compile(r"(?<![\d-])\d(?:[ -]?\d){12,24}(?!\d)"),
        _card_length,
    ),
    Detector(
        "phone",
        regex.compile(
            r"(?<![\w+])(?:"
            r"\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,6}"  # international, E.164 with separators
            r"|(?:\(\d{3}\) ?|\d{3}[-. ])\d{3}[-. ]\d{4}"  # North American
            r")(?![\d])"
        ),
        _phone_length,
    ),
)
_PRIORITY = {d.type: i for i, d in enumerate(DETECTORS)}


@dataclass(frozen=True)
class _Scan:
    findings: list[Finding]
    hold_from: int  # text from here on may still become (part of) a secret


def _scan(text: str, pos: int, final: bool) -> _Scan:
    """Validated, non-overlapping findings in ``text[pos:]`` and where to stop releasing.

    With ``final`` false, a candidate is unsettled when the text from its start to the
    end could still be (the start of) one match: a partial match, or a complete one
    that more text could extend ("a@b.co" + ".u" may become "a@b.co.uk"). Nothing
    from the earliest unsettled start on is final.
    """
    candidates: list[Finding] = []
    hold_from = len(text)
    for detector in DETECTORS:
        for match in detector.pattern.finditer(text, pos=pos, partial=not final):
            start, end = match.span()
            if end == start:
                continue
            if not final and (
                match.partial or detector.pattern.fullmatch(text, pos=start, partial=True)
            ):
                hold_from = min(hold_from, start)
                continue
            length = detector.valid_length(match.group())
            if length is not None:
                candidates.append(Finding(detector.type, start, start + length))
    candidates.sort(key=lambda f: (f.start, -(f.end - f.start), _PRIORITY[f.type]))
    findings: list[Finding] = []
    for finding in candidates:
        if findings and finding.start < findings[-1].end:
            continue
        findings.append(finding)
    # A settled finding that straddles the cut is held back whole.
    for finding in findings:
        if finding.start < hold_from < finding.end:
            hold_from = finding.start
    return _Scan([f for f in findings if f.end <= hold_from], hold_from)


def _redact(text: str, findings: list[Finding], offset: int = 0) -> str:
    """``text`` (which starts at ``offset``) with each finding replaced by its placeholder."""
    parts, cursor = [], 0
    for finding in findings:
        parts.append(text[cursor : finding.start - offset])
        parts.append(PLACEHOLDERS[finding.type])
        cursor = finding.end - offset
    parts.append(text[cursor:])
    return "".join(parts)


def scan(text: str) -> list[Finding]:
    """Every secret in ``text``, in order, without overlaps."""
    return _scan(text, 0, final=True).findings


def redact(text: str) -> tuple[str, list[Finding]]:
    """``text`` with every secret replaced by ``[EMAIL]``/``[PHONE]``/``[CARD]``/``[IBAN]``."""
    findings = scan(text)
    return _redact(text, findings), findings


class StreamGuard:
    """Redacts a text stream chunk by chunk, holding back only what could still match.

    ``feed`` returns the redacted text that is now final and the findings in it (spans
    into the whole unredacted stream); ``finish`` releases the rest. The buffer keeps
    one released character in front of the held text, for the patterns' look-behinds.
    """

    CONTEXT = 1

    def __init__(self) -> None:
        self._buffer = ""  # text from self._origin on
        self._origin = 0  # stream offset of self._buffer[0]
        self._released = 0  # stream offset up to which text has been released

    @property
    def held(self) -> int:
        """Characters received but not yet released."""
        return self._origin + len(self._buffer) - self._released

    def feed(self, chunk: str) -> tuple[str, list[Finding]]:
        self._buffer += chunk
        return self._release(final=False)

    def finish(self) -> tuple[str, list[Finding]]:
        return self._release(final=True)

    def _release(self, final: bool) -> tuple[str, list[Finding]]:
        pos = self._released - self._origin
        result = _scan(self._buffer, pos, final)
        released = _redact(self._buffer[pos : result.hold_from], result.findings, pos)
        findings = [
            Finding(f.type, f.start + self._origin, f.end + self._origin) for f in result.findings
        ]
        self._released = self._origin + result.hold_from
        keep_from = max(0, result.hold_from - self.CONTEXT)
        self._buffer = self._buffer[keep_from:]
        self._origin += keep_from
        return released, findings
