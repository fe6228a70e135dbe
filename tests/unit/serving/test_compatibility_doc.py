"""docs/compatibility.md lists the sampling ranges every engine is held to: exactly the
shared table's, so the page cannot drift from what the server refuses."""

from __future__ import annotations

import re
from pathlib import Path

from tritonforge.serving.sampling import range_rules

PAGE = Path(__file__).resolve().parents[3] / "docs" / "compatibility.md"


def test_the_page_lists_every_range_rule_of_the_shared_table() -> None:
    rows = dict(re.findall(r"^\| `(\w+)` \| (.+?) \|$", PAGE.read_text(encoding="utf-8"), re.M))
    assert rows == range_rules()
