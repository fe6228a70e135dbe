"""docs/reference/ says what the code does: the generated pages are current, and the tables
they come from name exactly the keys the code reads.

The pages are regenerated and compared (a new flag, metric or table entry without a new
page fails). The tables are held to the readers themselves: the config.pbtxt readers run
against a mapping that records every key asked for, the sources are scanned for the keys
and environment variables read by name, and the settings-file table is compared with the
engine adapters' own constants.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tritonforge.environment import EXTENDED, variable_names
from tritonforge.paths import REPO_ROOT
from tritonforge.reference import __main__ as cli
from tritonforge.reference.pages import (
    REFERENCE_DIR,
    SETTINGS_FILE_KEYS,
    settings_file_keys,
    stale_pages,
)
from tritonforge.serving.admission import AdmissionSettings, model_defaults
from tritonforge.serving.outbox import StreamPolicy
from tritonforge.serving.parameters import MAX_INFLIGHT_DEFAULT, parameter_names
from tritonforge.serving.restarts import RestartPolicy

PACKAGE = REPO_ROOT / "tritonforge"


class RecordingParameters(dict[str, str]):
    """An empty config.pbtxt ``parameters`` mapping that remembers every key read."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.asked.add(key)
        return default

    def __getitem__(self, key: str) -> str:
        self.asked.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.asked.add(key)
        return False


def python_sources() -> Iterator[Path]:
    """The package (but the benchmark tools) and the models' own files."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if "bench" not in path.relative_to(PACKAGE).parts:
            yield path
    yield from model_sources()


def model_sources() -> Iterator[Path]:
    """What runs inside a model (where config.pbtxt parameters are read)."""
    for part in ("triton", "serving", "engines", "pipelines"):
        yield from sorted((PACKAGE / part).rglob("*.py"))
    yield from sorted((REPO_ROOT / "ensembles").glob("*/1/model.py"))
    yield from sorted((REPO_ROOT / "backends").glob("*/model.py"))


def test_the_generated_pages_are_current() -> None:
    assert not stale_pages(), (
        f"{stale_pages()} in {REFERENCE_DIR} differ from the code: "
        "run `python -m tritonforge.reference`"
    )
    assert cli.main(["--check"]) == 0


def test_the_parameter_table_names_exactly_what_the_readers_ask_for() -> None:
    recorded = RecordingParameters()
    RestartPolicy.from_parameters(recorded)
    StreamPolicy.from_parameters(recorded)
    AdmissionSettings.from_parameters(recorded)
    model_defaults(recorded)
    by_name = re.compile(r"""param(?:eter)?s?\.get\(\s*["']([a-z_]+)["']""")
    scanned = {key for path in model_sources() for key in by_name.findall(path.read_text())}
    backend = (REPO_ROOT / "backends/tokenizer/triton/backend.cpp").read_text()
    cpp = set(re.findall(r'parameter\("([a-z_]+)"\)', backend))
    read = recorded.asked | scanned | cpp
    table = parameter_names()
    assert read - table == set(), (
        f"read but not in tritonforge/serving/parameters.py: {read - table}"
    )
    assert table - read == set(), f"in the table but read by nothing: {table - read}"
    assert "admission_alpha" in table


def test_the_max_inflight_default_is_the_runtimes() -> None:
    model = (PACKAGE / "triton" / "model.py").read_text()
    defaults = re.findall(r"""parameters\.get\(\s*"max_inflight",\s*"(\d+)"\s*\)""", model)
    assert defaults == [str(MAX_INFLIGHT_DEFAULT)], defaults


def test_the_environment_table_names_exactly_what_the_code_reads() -> None:
    reads = re.compile(
        r"""(?:environ(?:\.get|\.setdefault|\.pop)?\(|environ\[|getenv\(|env\.setdefault\("""
        r"""|env\[|env\.get\(|_port\(|\w*_ENV\s*=\s*)\s*["']([A-Z][A-Z0-9_]+)["']"""
    )
    sources = {*python_sources(), REPO_ROOT / "tests" / "conftest.py"}
    read = {name for path in sources for name in reads.findall(path.read_text())} - EXTENDED
    table = variable_names()
    assert read - table == set(), f"read but not in tritonforge/environment.py: {read - table}"
    assert table - read == set(), f"in the table but read by nothing: {table - read}"


def test_the_settings_file_table_covers_the_adapters_own_keys() -> None:
    code = set().union(*settings_file_keys().values())
    table = {key for _, key in SETTINGS_FILE_KEYS}
    assert code == table, (code - table, table - code)


def test_the_metrics_page_lists_what_the_issue_found_missing() -> None:
    metrics = (REFERENCE_DIR / "metrics.md").read_text()
    assert "`<prefix>:lora_requests_info`" in metrics
    assert "`tritonforge_tritonserver_restarts_total`" in metrics
    assert "`admission_alpha`" in (REFERENCE_DIR / "configuration.md").read_text()
