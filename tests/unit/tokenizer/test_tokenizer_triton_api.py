"""The C++ backend's hand-written Triton API declarations match the pinned release.

``backends/tokenizer/triton/triton_api.h`` declares Triton's C functions and enum values
itself; the backend resolves them by name when Triton loads it, so a wrong type or value
would compile and load and then fail in a call. ``api_check.py`` compiles static_asserts
generated from ``triton_api.reference.json`` (the r24.10 facts) against the header. If
this fails after a deliberate change or a Triton upgrade, update the reference from the
new release's headers and confirm it with ``api_check.py --upstream <core>/include``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "backends" / "tokenizer" / "triton" / "api_check.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("triton_api_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


api_check = _load()


@pytest.fixture(scope="module")
def cxx() -> str:
    found = api_check.compiler()
    # The project builds its C++ with this compiler; its absence is a broken setup.
    assert found, "no C++ compiler ($CXX, g++, c++): see scripts/bootstrap.sh"
    return found


def test_header_and_reference_name_the_same_functions_handles_and_constants() -> None:
    assert api_check.coverage_problems() == []


def test_coverage_notices_a_declaration_missing_from_the_reference() -> None:
    header = api_check.HEADER.read_text().replace(
        "}  // extern",
        "TRITONSERVER_Error* TRITONBACKEND_RequestId(TRITONBACKEND_Request*, const char**);\n"
        "}  // extern",
    )
    assert api_check.coverage_problems(header_text=header) == [
        "triton_api.h declares function TRITONBACKEND_RequestId, not in the reference"
    ]


def test_declarations_and_values_match_the_pinned_release(cxx: str) -> None:
    source = api_check.render(api_check.load_reference(), "ours")
    result = api_check.compile_check(source, [api_check.HERE], cxx)
    assert result.returncode == 0, result.stderr


def _drifted_header(tmp_path: Path, old: str, new: str) -> Path:
    text = api_check.HEADER.read_text()
    assert old in text
    (tmp_path / "triton_api.h").write_text(text.replace(old, new, 1))
    return tmp_path


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "kTypeBytes = 13",
            "kTypeBytes = 14",
            "kTypeBytes must be == TRITONSERVER_TYPE_BYTES (13)",
        ),
        (
            "std::uint32_t* dims_count",
            "std::uint64_t* dims_count",
            "TRITONBACKEND_InputProperties: parameter 5 is uint32_t*",
        ),
        (
            "std::uint32_t request_count",
            "std::uint64_t request_count",
            "TRITONBACKEND_ModelInstanceExecute: parameter 3 is const uint32_t",
        ),
    ],
    ids=["enum-value", "parameter-type", "entry-point"],
)
def test_a_drifted_header_fails_the_check(
    cxx: str, tmp_path: Path, old: str, new: str, message: str
) -> None:
    """The check is only worth having if it fails: one drift of each kind, compiled."""
    source = api_check.render(api_check.load_reference(), "ours")
    result = api_check.compile_check(source, [_drifted_header(tmp_path, old, new)], cxx)
    assert result.returncode != 0
    assert message in result.stderr


def _headers_shaped_like_triton(reference: dict, directory: Path) -> Path:
    """Minimal C headers built from the reference, with real enum types: they let the
    upstream mode be compiled here, where Triton's own headers are not available."""
    core = directory / "triton" / "core"
    core.mkdir(parents=True)
    lines = ["#pragma once", "#include <stdbool.h>", "#include <stddef.h>", "#include <stdint.h>"]
    lines += [f"struct {handle};" for handle in reference["handles"]]
    for name, enum in reference["enums"].items():
        members = ", ".join(f"{k} = {v}" for k, v in enum["values"].items())
        lines.append(f"typedef enum {{ {members} }} {name};")
    for name, fact in reference["macros"].items():
        lines.append(f"#define {name} {fact['value']}")
    lines.append('extern "C" {')
    for name, fn in reference["functions"].items():
        lines.append(f"{fn['returns']} {name}({', '.join(fn['params'])});")
    lines.append("}")
    (core / "tritonserver.h").write_text("\n".join(lines) + "\n")
    (core / "tritonbackend.h").write_text('#pragma once\n#include "triton/core/tritonserver.h"\n')
    return directory


def test_upstream_mode_compiles_against_headers_with_real_enums(cxx: str, tmp_path: Path) -> None:
    reference = api_check.load_reference()
    include = _headers_shaped_like_triton(reference, tmp_path)
    result = api_check.compile_check(
        api_check.render(reference, "upstream"), [include], cxx, system=True
    )
    assert result.returncode == 0, result.stderr
