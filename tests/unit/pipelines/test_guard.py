"""The guard's detectors and the streaming guard (pure logic, no server)."""

from __future__ import annotations

import random

import pytest

from tritonforge.pipelines.guard import Finding, StreamGuard, iban_valid, luhn_valid, redact, scan

TRUE_POSITIVES = [
    (
        "write to jane.doe+news@mail.example.co.uk today",
        "email",
        "jane.doe+news@mail.example.co.uk",
    ),
    ("contact: BOB_99@Example.ORG.", "email", "BOB_99@Example.ORG"),
    ("call +44 20 7946 0958 now", "phone", "+44 20 7946 0958"),
    ("call +1 (415) 555-2671.", "phone", "+1 (415) 555-2671"),
    ("office (555) 123-4567 ext", "phone", "(555) 123-4567"),
    ("cell 555.123.4567", "phone", "555.123.4567"),
    ("visa 4111 1111 1111 1111 exp", "card", "4111 1111 1111 1111"),
    ("amex 3782-822463-10005 ok", "card", "3782-822463-10005"),
    ("mc 5555555555554444", "card", "5555555555554444"),
    ("pay 4111 1111 1111 1111 2025 expiry", "card", "4111 1111 1111 1111"),
    ("iban DE89 3704 0044 0532 0130 00 please", "iban", "DE89 3704 0044 0532 0130 00"),
    ("GB82WEST12345698765432", "iban", "GB82WEST12345698765432"),
    ("to FR14 2004 1010 0505 0001 3M02 606 EUR", "iban", "FR14 2004 1010 0505 0001 3M02 606"),
]

FALSE_POSITIVES = [
    "meet me @ noon, or at a@b",  # no domain
    "version 1.2.3@beta is out",  # no TLD after @
    "the date is 2024-01-15 and order 12345678",  # dates and short numbers
    "pi is 3.14159265358979323846",  # long digit run, no card prefix
    "card 4111 1111 1111 1112 fails Luhn",
    "1234567890123456 is not a card (starts with 1)",
    "iban DE89 3704 0044 0532 0130 01 has a bad check",
    "de89 3704 0044 0532 0130 00 is lower case",
    "call 555-1234 (seven digits only)",
    "ISBN 978-3-16-148410-0",
    "the year +2024 and +3 points",
    "email me at john..doe@example.com",
]


@pytest.mark.parametrize(("text", "kind", "secret"), TRUE_POSITIVES)
def test_detects_and_redacts_each_kind(text: str, kind: str, secret: str) -> None:
    redacted, findings = redact(text)
    start = text.index(secret)
    assert findings == [Finding(kind, start, start + len(secret))]
    assert redacted == text.replace(secret, f"[{kind.upper()}]")


@pytest.mark.parametrize("text", FALSE_POSITIVES)
def test_leaves_look_alikes_alone(text: str) -> None:
    assert scan(text) == []


def test_checksums() -> None:
    assert luhn_valid("79927398713") and not luhn_valid("79927398710")
    assert iban_valid("GB82WEST12345698765432") and not iban_valid("GB82WEST12345698765433")


def test_overlapping_candidates_keep_the_earliest_longest() -> None:
    # The IBAN's digits also look like a card run; the IBAN wins, once.
    text = "DE89 3704 0044 0532 0130 00 and jo@ex.com"
    assert [f.type for f in scan(text)] == ["iban", "email"]


def test_offsets_are_code_points_in_the_original_text() -> None:
    text = "héllo ✉ jo@ex.com"
    (finding,) = scan(text)
    assert text[finding.start : finding.end] == "jo@ex.com"


def _stream(chunks: list[str]) -> tuple[str, list[Finding], list[str]]:
    guard = StreamGuard()
    released = []
    findings: list[Finding] = []
    for chunk in chunks:
        text, found = guard.feed(chunk)
        released.append(text)
        findings += found
    text, found = guard.finish()
    released.append(text)
    return "".join(released), findings + found, released


def test_a_secret_split_across_chunks_is_caught() -> None:
    text, findings, released = _stream(["My card is 4111 11", "11 1111 1111", " thanks"])
    assert text == "My card is [CARD] thanks"
    assert findings == [Finding("card", 11, 30)]
    assert "4111" not in "".join(released)


def test_only_what_a_pattern_needs_is_held_back() -> None:
    guard = StreamGuard()
    assert guard.feed("The capital of France is ") == ("The capital of France is ", [])
    assert guard.feed("Paris") == ("", [])  # could still become Paris@example.com
    assert guard.feed(". It") == ("Paris. ", [])
    assert guard.held == 2


@pytest.mark.parametrize("seed", range(200))
def test_any_chunking_gives_the_whole_text_result(seed: int) -> None:
    rng = random.Random(seed)
    text = " ".join(
        t for t, _, _ in rng.sample(TRUE_POSITIVES, 5) + [(f, 0, 0) for f in FALSE_POSITIVES[:4]]
    )
    cuts = sorted(rng.sample(range(1, len(text)), 12))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    expected_text, expected_findings = redact(text)
    streamed_text, streamed_findings, _ = _stream(chunks)
    assert streamed_text == expected_text
    assert streamed_findings == expected_findings
