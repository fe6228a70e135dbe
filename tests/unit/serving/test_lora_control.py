"""LoRA adapters loaded at run time, without a server: the control request, the checks a
load makes, multi_lora.json rewritten, and the operations run on the real Runtime's loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.adapters import adapter_dir, text
from tests.fakes import RecordingLogger, RecordingMetrics, ScriptedEngine
from tritonforge.engines.lora import (
    NO_ADAPTER_AT,
    UNKNOWN_ADAPTER,
    LoraAdapter,
    load_adapters,
    new_adapter,
    read_listing,
    write_listing,
)
from tritonforge.serving.errors import RequestError
from tritonforge.serving.lora_control import AdapterControl, ControlRequest, parse_control
from tritonforge.serving.runtime import Runtime

# --- the control request ----------------------------------------------------------------


def test_a_request_without_lora_control_generates() -> None:
    assert parse_control({"text_input": text("hi"), "lora_name": text("a")}) is None


def test_load_unload_and_list_as_tensors() -> None:
    load = {"lora_control": text("load"), "lora_name": text("a"), "lora_path": text("/p")}
    assert parse_control(load) == ControlRequest("load", "a", "/p")
    unload = {"lora_control": text("unload"), "lora_name": text("a"), "stream": np.array([False])}
    assert parse_control(unload) == ControlRequest("unload", "a")
    assert parse_control({"lora_control": text("list")}) == ControlRequest("list")


@pytest.mark.parametrize(
    ("inputs", "field", "rule"),
    [
        ({"lora_control": text("reload")}, "lora_control", "must be one of load, unload, list"),
        (
            {"lora_control": text("load"), "lora_name": text("a")},
            "lora_path",
            "needs its directory",
        ),
        ({"lora_control": text("unload")}, "lora_name", "needs the adapter's name"),
        (
            {"lora_control": text("unload"), "lora_name": text("a"), "lora_path": text("/p")},
            "lora_path",
            "only lora_control load takes a path",
        ),
        (
            {"lora_control": text("list"), "text_input": text("hi")},
            "text_input",
            "a lora_control request generates nothing",
        ),
        ({"text_input": text("hi"), "lora_path": text("/p")}, "lora_path", "only a control"),
    ],
)  # fmt: skip
def test_a_bad_control_request_names_the_field(inputs: dict, field: str, rule: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_control(inputs)
    assert info.value.field == field and rule in info.value.rule


# --- the checks of a load -----------------------------------------------------------------


def test_a_new_adapter_resolves_as_multi_lora_json_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ADAPTERS", str(tmp_path / "store"))
    path = adapter_dir(tmp_path / "store", "gamma", rank=4)
    assert new_adapter("gamma", "$ADAPTERS/gamma", tmp_path, {}, 7) == LoraAdapter(
        "gamma", 7, path, 4
    )
    version = tmp_path / "1"
    adapter_dir(version, "local")  # relative to the version directory
    assert new_adapter("local", "local", version, {}, 1).path == version / "local"


@pytest.mark.parametrize(
    ("name", "path", "field", "rule"),
    [
        ("a b", "/x", "lora_name", "must be 1-128 letters"),
        ("alpha", "/x", "lora_name", "LoRA adapter 'alpha' is already loaded"),
        ("g", "/no/such/adapter", "lora_path", f"{NO_ADAPTER_AT} /no/such/adapter"),
        ("g", "EMPTY", "lora_path", "no adapter_config.json: not a PEFT adapter"),
        ("g", "nowhere/relative", "lora_path", "must be absolute, start with $VAR"),
        ("g", "$UNSET_ADAPTER_ROOT/g", "lora_path", "UNSET_ADAPTER_ROOT"),
    ],
)
def test_a_bad_load_names_the_field(
    tmp_path: Path, name: str, path: str, field: str, rule: str
) -> None:
    (tmp_path / "empty").mkdir()
    served = {"alpha": LoraAdapter("alpha", 1, tmp_path, 8)}
    with pytest.raises(RequestError) as info:
        new_adapter(name, path.replace("EMPTY", str(tmp_path / "empty")), tmp_path, served, 2)
    assert info.value.field == field and rule in info.value.rule


def test_the_listing_is_rewritten_whole_and_removed_when_empty(tmp_path: Path) -> None:
    write_listing(tmp_path, {"a": "$X/a", "b": "b"})
    assert read_listing(tmp_path) == {"a": "$X/a", "b": "b"}
    assert [p.name for p in tmp_path.iterdir()] == ["multi_lora.json"]  # no staging left
    write_listing(tmp_path, {})
    assert not (tmp_path / "multi_lora.json").exists() and read_listing(tmp_path) == {}


# --- operations on an engine --------------------------------------------------------------


class LoadingEngine(ScriptedEngine):
    """Serves what it is told to load; ``refuse`` makes the next load fail as vLLM's can."""

    refuse: str | None = None

    @property
    def loads_adapters(self) -> bool:
        return True

    async def load_adapter(self, adapter: LoraAdapter) -> None:
        if self.refuse is not None:
            raise RequestError("lora_path", self.refuse)
        self.adapters = {**self.adapters, adapter.name: adapter}

    async def unload_adapter(self, name: str) -> None:
        self.adapters = {k: v for k, v in self.adapters.items() if k != name}


@pytest.fixture
def version(tmp_path: Path) -> Path:
    version = tmp_path / "1"
    adapter_dir(version, "alpha")
    adapter_dir(tmp_path, "gamma", rank=4)
    write_listing(version, {"alpha": "alpha"})
    return version


def run(runtime: Runtime, control: AdapterControl, request: ControlRequest) -> dict[str, Any]:
    return runtime.run_on_loop(control.run(request)).result(timeout=10)


@pytest.fixture
def running(version: Path):
    engine = LoadingEngine()
    engine.adapters = {a.name: a for a in load_adapters(version)}
    runtime = Runtime(engine, RecordingMetrics(), RecordingLogger())
    runtime.start()
    yield engine, runtime, AdapterControl(engine, version)
    runtime.stop()


def test_a_load_reaches_the_engine_and_the_file_with_a_fresh_id(running, version) -> None:
    engine, runtime, control = running
    gamma = str(version.parent / "gamma")
    answer = run(runtime, control, ControlRequest("load", "gamma", gamma))
    assert answer["adapters"] == {"alpha": str(version / "alpha"), "gamma": gamma}
    assert answer["loads_adapters"] is True
    assert read_listing(version) == {"alpha": "alpha", "gamma": gamma}  # as it was written
    assert engine.adapters["gamma"].int_id == 2 and engine.adapters["gamma"].rank == 4
    run(runtime, control, ControlRequest("unload", "gamma"))
    run(runtime, control, ControlRequest("load", "gamma", gamma))
    assert engine.adapters["gamma"].int_id == 3  # ids are never reused in a model's life
    assert [a.name for a in load_adapters(version)] == ["alpha", "gamma"]  # the next load's


def test_a_refused_load_leaves_engine_and_file_as_they_were(running, version) -> None:
    engine, runtime, control = running
    engine.refuse = "vLLM could not load the adapter"
    with pytest.raises(RequestError, match="vLLM could not load"):
        run(runtime, control, ControlRequest("load", "gamma", str(version.parent / "gamma")))
    assert set(engine.adapters) == {"alpha"} and read_listing(version) == {"alpha": "alpha"}


def test_an_unload_takes_it_out_of_the_file_and_an_unknown_one_is_named(running, version) -> None:
    _, runtime, control = running
    with pytest.raises(RequestError) as info:
        run(runtime, control, ControlRequest("unload", "gamma"))
    assert str(info.value) == f"lora_name: {UNKNOWN_ADAPTER} 'gamma'; available: alpha"
    assert run(runtime, control, ControlRequest("unload", "alpha"))["adapters"] == {}
    assert not (version / "multi_lora.json").exists()


def test_an_engine_that_cannot_load_adapters_says_so(version: Path) -> None:
    runtime = Runtime(ScriptedEngine(), RecordingMetrics(), RecordingLogger())
    runtime.start()
    try:
        control = AdapterControl(runtime.engine, version)
        assert run(runtime, control, ControlRequest("list"))["loads_adapters"] is False
        with pytest.raises(RequestError, match="does not load LoRA adapters at run time"):
            run(runtime, control, ControlRequest("load", "gamma", str(version.parent / "gamma")))
    finally:
        runtime.stop()
    assert read_listing(version) == {"alpha": "alpha"}
