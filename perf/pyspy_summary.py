"""Where a stub's GIL time goes, from a py-spy recording of collapsed stacks.

Why: a change to the serving path starts from a profile of the stub under load. py-spy
(``py-spy record -p <stub pid> --gil --format raw -o stub.raw``) writes one line per
distinct stack with its sample count; start-up (imports, loading the tokenizer) is in
the same file and is left out here, so the shares are of the time spent serving.
Prints the functions with the most samples of their own and the most samples under
them, as percentages; ``--keep FILE`` also writes the serving stacks alone, with paths
inside the clone made relative, small enough to commit beside the summary.

    .venv/bin/python perf/pyspy_summary.py stub.raw --top 25 --keep stub.serving.raw
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: Frames that mark start-up work rather than serving.
START_UP = ("importlib", "load_tokenizer", "_load_unlocked", "initialize (")


def serving_stacks(raw: Path) -> dict[str, int]:
    stacks: dict[str, int] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and not any(mark in stack for mark in START_UP):
            stacks[stack.replace(f"{REPO}/", "")] += int(count)
    return stacks


def summary(stacks: dict[str, int], top: int) -> str:
    total = sum(stacks.values())
    own: collections.Counter[str] = collections.Counter()
    under: collections.Counter[str] = collections.Counter()
    for stack, count in stacks.items():
        frames = stack.split(";")
        own[frames[-1]] += count
        for frame in set(frames):
            under[frame] += count
    lines = [f"samples: {total}", "", "own samples:"]
    lines += [f"{100 * n / total:5.1f} %  {frame}" for frame, n in own.most_common(top)]
    lines += ["", "samples under (inclusive):"]
    lines += [f"{100 * n / total:5.1f} %  {frame}" for frame, n in under.most_common(top)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("raw", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--keep", type=Path, help="write the serving stacks here")
    opts = parser.parse_args()
    stacks = serving_stacks(opts.raw)
    print(summary(stacks, opts.top), end="")
    if opts.keep is not None:
        opts.keep.write_text("".join(f"{s} {n}\n" for s, n in sorted(stacks.items())))


if __name__ == "__main__":
    main()
