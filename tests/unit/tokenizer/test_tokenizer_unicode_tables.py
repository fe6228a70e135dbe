"""The committed Unicode tables are exactly what the generator reads from ``tokenizers``.

If this fails after upgrading ``tokenizers``, run ``scripts/gen_unicode_tables.py``,
rebuild (scripts/build_tokenizer.sh) and let the parity tests judge the new tables.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "gen_unicode_tables.py"


def test_committed_tables_equal_a_fresh_generation() -> None:
    spec = importlib.util.spec_from_file_location("gen_unicode_tables", SCRIPT)
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    fresh = generator.generate()
    assert generator.OUTPUT.read_text() == fresh, "run scripts/gen_unicode_tables.py"
