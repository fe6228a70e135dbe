"""Turn a contract's traffic mix into one concrete, seeded list of requests.

Every target and every tool is driven from the same list (written as a trace file),
so "same load" means the same prompts, token for token, and the same output lengths.
Prompts are made of whole-word vocabulary tokens of the model's own tokenizer, so a
drawn input length is the length the engine actually prefills (checked by re-encoding).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tritonforge.bench.contract import (
    Contract,
    Fixed,
    LengthDistribution,
    LogNormal,
    Normal,
    Uniform,
)

Encode = Callable[[str], list[int]]

#: Common words for the perf scripts' prompts: distinct prompts, alike in length.
WORDS = (
    "river",
    "stone",
    "cloud",
    "paper",
    "lamp",
    "garden",
    "window",
    "music",
    "planet",
    "forest",
    "silver",
    "bridge",
)


def random_words(rng: random.Random, count: int) -> str:
    """``count`` words drawn from :data:`WORDS`: a prompt no earlier request shares."""
    return " ".join(rng.choice(WORDS) for _ in range(count))


@dataclass(frozen=True)
class BenchRequest:
    """One request of the workload; ``output_tokens`` is the max_tokens sent."""

    index: int
    request_class: str
    prompt: str
    input_tokens: int
    output_tokens: int
    shares_prefix: bool


def draw_length(dist: LengthDistribution, rng: random.Random) -> int:
    """One length from a contract distribution, clipped to its bounds."""
    low, high = dist.bounds()
    match dist:
        case Fixed():
            value = float(dist.value)
        case Uniform():
            value = float(rng.randint(dist.min, dist.max))
        case Normal():
            value = rng.gauss(dist.mean_, dist.stddev)
        case LogNormal():
            import math

            value = rng.lognormvariate(math.log(dist.median), dist.sigma)
    return int(min(max(round(value), low), high))


class PromptBuilder:
    """Build texts of an exact token count from single-token words of the vocabulary."""

    def __init__(self, vocabulary: Sequence[str], encode: Encode) -> None:
        self._encode = encode
        words = [w for w in vocabulary if w.startswith(" ") and w[1:].isalpha() and len(w) > 3]
        # Keep only words that really encode to one token in running text.
        self._words = sorted({w for w in words[:20000] if len(encode(w)) == 1})
        if len(self._words) < 100:
            raise RuntimeError("the tokenizer has too few whole-word tokens to build prompts")

    @classmethod
    def for_model(cls, model_dir: Path) -> PromptBuilder:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        vocab = [tokenizer.convert_tokens_to_string([t]) for t in tokenizer.get_vocab()]

        def encode(text: str) -> list[int]:
            return tokenizer.encode(text, add_special_tokens=False)

        return cls(vocab, encode)

    def count(self, text: str) -> int:
        return len(self._encode(text))

    def text(self, tokens: int, rng: random.Random, lead: str = "") -> str:
        """``lead`` followed by random words, ``tokens`` tokens long in total."""
        lead_tokens = self.count(lead) if lead else 0
        if lead_tokens > tokens:
            raise ValueError(
                f"its instruction and shared prefix alone are {lead_tokens} tokens, "
                f"more than the {tokens} drawn"
            )
        body_tokens = tokens - lead_tokens
        text = lead + "".join(rng.choice(self._words) for _ in range(body_tokens))
        # Word boundaries almost always hold; repair the rare merge or split exactly.
        for _ in range(8):
            diff = tokens - self.count(text)
            if diff == 0:
                return text
            if diff > 0:
                text += "".join(rng.choice(self._words) for _ in range(diff))
            else:
                text = text.rsplit(" ", -diff)[0] if " " in text else text
        raise RuntimeError(f"could not build a prompt of exactly {tokens} tokens")


def build_workload(
    contract: Contract, builder: PromptBuilder, count: int, stream: int = 0, text: str = ""
) -> list[BenchRequest]:
    """``count`` requests following the mix; the same seed, stream and text give the same list.

    Each load level (and the warm-up) draws its own ``stream``: a level must not resend
    another level's prompts, or the prefix cache would turn them into free hits. For
    the same reason every round of every target draws its own ``text`` (the words of
    the prompts) while the classes and lengths stay those of the level's stream: the
    targets get the same load, and no target finds another's prompts in a shared
    engine's cache, nor its own from an earlier round.
    """
    rng = random.Random(f"{contract.seed}:{stream}")
    text_rng = random.Random(f"{contract.seed}:{stream}:text:{text}")
    traffic = contract.traffic
    prefix_spec = traffic.shared_prefix
    prefix = (
        builder.text(prefix_spec.tokens, random.Random(contract.seed + 1))
        if (prefix_spec.share > 0 and prefix_spec.tokens > 0)
        else ""
    )
    classes = traffic.classes
    weights = [c.share for c in classes]
    requests = []
    for index in range(count):
        cls = rng.choices(classes, weights)[0]
        input_tokens = draw_length(cls.input_tokens, rng)
        output_tokens = draw_length(cls.output_tokens, rng)
        shares = bool(prefix) and rng.random() < prefix_spec.share
        # The body is random words, so only the declared prefix is ever common to
        # two requests: prefix-cache hits are exactly what the contract asked for.
        lead = (prefix if shares else "") + cls.instruction
        try:
            prompt = builder.text(input_tokens, text_rng, lead=lead)
        except ValueError as error:
            raise ValueError(
                f"traffic class {cls.name!r}: input_tokens: {error}; raise its minimum"
            ) from error
        requests.append(BenchRequest(index, cls.name, prompt, input_tokens, output_tokens, shares))
    return requests


def write_trace(requests: Sequence[BenchRequest], path: Path) -> Path:
    """The aiperf ``mooncake_trace`` form: literal text and output length per line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for request in requests:
            line = {"text_input": request.prompt, "output_length": request.output_tokens}
            handle.write(json.dumps(line) + "\n")
    return path


def write_workload(requests: Sequence[BenchRequest], path: Path) -> Path:
    """The full request list (for the offline driver and for the record)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([asdict(r) for r in requests]))
    return path


def read_workload(path: Path) -> list[BenchRequest]:
    return [BenchRequest(**item) for item in json.loads(path.read_text())]
