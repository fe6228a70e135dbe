"""``python -m tritonforge.reference [--check]``: write (or check) docs/reference/*.md."""

from __future__ import annotations

import argparse
import sys

from tritonforge.reference.pages import REFERENCE_DIR, stale_pages, write_pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tritonforge.reference",
        description="Write docs/reference/ from the code's definitions.",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a page is out of date"
    )
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages()
        for name in stale:
            print(f"{REFERENCE_DIR / name} is out of date: run python -m tritonforge.reference")
        return 1 if stale else 0
    for path in write_pages():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
