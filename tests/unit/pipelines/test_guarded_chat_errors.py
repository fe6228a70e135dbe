"""guarded_chat maps errors to Triton codes as every LLM model does, plus its own two.

Runs the Triton edge against a stand-in ``triton_python_backend_utils`` (no server):
only the error codes and the mapping are exercised.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

from tritonforge.pipelines.guarded_chat import ClientCancelled, InnerError
from tritonforge.serving.errors import EngineBusy, RequestError

MODEL = Path(__file__).resolve().parents[3] / "ensembles" / "guarded_chat" / "1" / "model.py"


class TritonError:
    INTERNAL, UNAVAILABLE, INVALID_ARG, CANCELLED, NOT_FOUND = range(5)

    def __init__(self, message: str, code: int) -> None:
        self.message, self.code = message, code


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch):
    fake = types.ModuleType("triton_python_backend_utils")
    fake.TritonError = TritonError
    fake.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    monkeypatch.delitem(sys.modules, "tritonforge.triton.model", raising=False)
    spec = importlib.util.spec_from_file_location("guarded_chat_model", MODEL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("tritonforge.triton.model", None)  # bound to the stand-in: drop it


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (RequestError("messages", "must not be empty"), TritonError.INVALID_ARG),
        (EngineBusy("busy"), TritonError.UNAVAILABLE),
        (ClientCancelled("cancelled"), TritonError.CANCELLED),
        (InnerError("no such model", TritonError.NOT_FOUND), TritonError.NOT_FOUND),
        (InnerError("no code", None), TritonError.INTERNAL),
        (RuntimeError("bug"), TritonError.INTERNAL),
    ],
)
def test_each_error_keeps_its_code(model, error: Exception, code: int) -> None:
    mapped = model._error(error)
    assert (mapped.code, mapped.message) == (code, str(error))
