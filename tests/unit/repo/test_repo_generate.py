"""``python -m tritonforge.repo add``: what it writes, and what it refuses to write.

Generated configs are compared with the shipped ones *as parsed protobuf messages*
(Triton's ModelConfig grammar), so a layout change is free but a changed tensor, step
or parameter is caught. Engine-argument lists come from a stand-in here; the real vLLM
list is exercised by tests/e2e/test_repo_generator.py (importing vLLM takes ~30 s).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import yaml

from tritonforge.launch.launcher import MODEL_REPOSITORY
from tritonforge.repo import pbtxt
from tritonforge.repo.engines import ENGINES, KnownArgs
from tritonforge.repo.generate import (
    AddError,
    AddRequest,
    add,
    engine_arg_value,
    parse_assignment,
    render,
)
from tritonforge.repo.paths import portable

KNOWN = KnownArgs(
    frozenset({"model", "dtype", "max_model_len", "enable_lora", "max_loras", "seed"}),
    "stand-in",
)
KNOWN_LLAMA = KnownArgs(frozenset({"model_path", "n_ctx", "n_threads", "n_parallel"}), "stand-in")
KNOWN_TRT = KnownArgs(frozenset({"model", "backend", "max_seq_len"}), "stand-in")


def known(engine: str) -> KnownArgs:
    return {"vllm": KNOWN, "llamacpp": KNOWN_LLAMA, "tensorrt_llm": KNOWN_TRT}[engine]


def request(tmp_path: Path, models_root: Path, **changes) -> AddRequest:
    settings = {
        "engine": "vllm",
        "model": str(models_root / "tiny-hf"),
        "name": "tiny",
        "repository": tmp_path / "repo",
    }
    return AddRequest(**(settings | changes))


def renamed(config, names: dict[str, str]):
    """A parsed config with model names swapped, so generated and shipped ones compare."""
    config.name = names.get(config.name, config.name)
    for step in config.ensemble_scheduling.step:
        step.model_name = names.get(step.model_name, step.model_name)
    return config


# --- what is written ---------------------------------------------------------------


def test_vllm_model_is_written_with_portable_paths_and_loads_its_checks(
    tmp_path, models_root, repo_env
) -> None:
    req = request(tmp_path, models_root, engine_args={"dtype": "bfloat16", "max_model_len": 64})
    reports = add(req, repo_env, known)
    model_dir = req.repository / "tiny"
    assert [r.name for r in reports] == ["tiny"] and reports[0].errors == []
    settings = json.loads((model_dir / "1" / "model.json").read_text())
    assert settings == {
        "model": "$TRITONFORGE_MODELS/tiny-hf",
        "dtype": "bfloat16",
        "max_model_len": 64,
    }
    assert (model_dir / "requires.txt").read_text().split() == ["vllm"]
    config = pbtxt.read(model_dir / "config.pbtxt")
    assert config.backend == "vllm" and config.name == "tiny"
    # Nothing left behind by the staging directory.
    assert sorted(p.name for p in req.repository.iterdir()) == ["tiny"]


def test_generated_vllm_config_equals_the_shipped_vllm_model(
    tmp_path, models_root, repo_env
) -> None:
    add(request(tmp_path, models_root, name="vllm_model"), repo_env, known)
    generated = pbtxt.read(tmp_path / "repo" / "vllm_model" / "config.pbtxt")
    shipped = pbtxt.read(MODEL_REPOSITORY / "vllm_model" / "config.pbtxt")
    generated.ClearField("name")  # the shipped LLM configs leave the name to the folder
    assert generated == shipped


def test_instances_and_max_inflight_reach_the_config(tmp_path, models_root, repo_env) -> None:
    add(request(tmp_path, models_root, instances=3, max_inflight=5), repo_env, known)
    config = pbtxt.read(tmp_path / "repo" / "tiny" / "config.pbtxt")
    assert [(g.count, g.kind) for g in config.instance_group] == [(3, 3)]  # KIND_MODEL
    assert pbtxt.parameters(config) == {"max_inflight": "5"}


def test_max_inflight_defaults_to_the_engines_shipped_bound(
    tmp_path, models_root, repo_env
) -> None:
    gguf = str(models_root / "tiny.gguf")
    add(request(tmp_path, models_root, engine="llamacpp", model=gguf), repo_env, known)
    config = pbtxt.read(tmp_path / "repo" / "tiny" / "config.pbtxt")
    assert pbtxt.parameters(config)["max_inflight"] == "16"
    assert config.backend == "llamacpp"


def test_llamacpp_model_names_the_gguf_and_the_wheels_gguf_as_a_variable(
    tmp_path, models_root, repo_env
) -> None:
    outside = tmp_path / "elsewhere.gguf"
    outside.write_bytes(b"GGUF" + bytes(8))
    req = request(tmp_path, models_root, engine="llamacpp", model=str(outside))
    add(req, repo_env | {"TRITONFORGE_GGUF": "/nowhere"}, known)
    assert json.loads((req.repository / "tiny" / "1" / "model.json").read_text()) == {
        "model_path": str(outside),
        "n_parallel": 8,
    }
    env = repo_env | {"TRITONFORGE_GGUF": str(outside)}
    assert portable(str(outside), env) == "$TRITONFORGE_GGUF"


def test_relative_model_paths_are_written_absolute(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert portable("models/x", {}) == str(tmp_path / "models" / "x")
    assert portable("$HOME/x", {}) == "$HOME/x"  # kept as the user wrote it


def test_tensorrt_llm_model_yaml_has_the_triton_section_and_the_dialect_inputs(
    tmp_path, models_root, repo_env
) -> None:
    req = request(tmp_path, models_root, engine="tensorrt_llm", engine_args={"max_seq_len": 64})
    add(req, repo_env, known)
    settings = yaml.safe_load((req.repository / "tiny" / "1" / "model.yaml").read_text())
    assert settings == {
        "model": "$TRITONFORGE_MODELS/tiny-hf",
        "backend": "pytorch",
        "triton_config": {"decoupled": True, "max_batch_size": 0},
        "max_seq_len": 64,
    }
    generated = pbtxt.read(req.repository / "tiny" / "config.pbtxt")
    shipped = pbtxt.read(MODEL_REPOSITORY / "tensorrt_llm_model" / "config.pbtxt")
    assert pbtxt.tensor_names(generated) == pbtxt.tensor_names(shipped)
    assert generated.backend == "tensorrtllm"


def test_tokenizer_ensemble_has_the_shape_of_the_shipped_ensemble_vllm(
    tmp_path, models_root, repo_env
) -> None:
    req = request(tmp_path, models_root, tokenizer_ensemble=True)
    reports = add(req, repo_env, known)
    names = ["tiny", "tiny_preprocessing", "tiny_postprocessing", "ensemble_tiny"]
    assert [r.name for r in reports] == names
    assert all(r.errors == [] for r in reports)
    swap = {
        "tiny": "vllm_model",
        "tiny_preprocessing": "preprocessing",
        "tiny_postprocessing": "postprocessing",
        "ensemble_tiny": "ensemble_vllm",
    }
    for generated_name, shipped_name in list(swap.items())[1:]:
        generated = renamed(pbtxt.read(req.repository / generated_name / "config.pbtxt"), swap)
        shipped = pbtxt.read(MODEL_REPOSITORY / shipped_name / "config.pbtxt")
        if shipped_name == "ensemble_vllm":
            generated.ClearField("name")
        else:  # the generated steps read the model's own tokenizer
            tokenizer = "$TRITONFORGE_MODELS/tiny-hf/tokenizer.json"
            assert generated.parameters["tokenizer_file"].string_value == tokenizer
            generated.parameters["tokenizer_file"].string_value = shipped.parameters[
                "tokenizer_file"
            ].string_value
        assert generated == shipped, shipped_name
        assert (req.repository / generated_name / "1").is_dir()  # Triton needs a version


def test_tokenizer_ensemble_for_a_gguf_needs_a_tokenizer(tmp_path, models_root, repo_env) -> None:
    gguf = str(models_root / "tiny.gguf")
    req = request(tmp_path, models_root, engine="llamacpp", model=gguf, tokenizer_ensemble=True)
    with pytest.raises(AddError, match="needs --tokenizer"):
        add(req, repo_env, known)
    req.tokenizer = str(models_root / "tiny-hf")  # a directory holding tokenizer.json
    add(req, repo_env, known)
    config = pbtxt.read(req.repository / "tiny_preprocessing" / "config.pbtxt")
    tokenizer = "$TRITONFORGE_MODELS/tiny-hf/tokenizer.json"
    assert pbtxt.parameters(config)["tokenizer_file"] == tokenizer


def test_tokenizer_ensemble_without_a_tokenizer_json_is_refused(
    tmp_path, models_root, repo_env
) -> None:
    (models_root / "tiny-hf" / "tokenizer.json").unlink()
    with pytest.raises(AddError, match=r"tokenizer\.json does not exist"):
        add(request(tmp_path, models_root, tokenizer_ensemble=True), repo_env, known)
    assert not (tmp_path / "repo" / "tiny").exists()


def test_lora_adapters_go_to_multi_lora_json_and_enable_lora(
    tmp_path, models_root, repo_env
) -> None:
    adapter = models_root / "adapters" / "pirate"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    req = request(tmp_path, models_root, loras={"pirate": str(adapter)})
    reports = add(req, repo_env, known)
    version = req.repository / "tiny" / "1"
    assert json.loads((version / "multi_lora.json").read_text()) == {
        "pirate": "$TRITONFORGE_MODELS/adapters/pirate"
    }
    settings = json.loads((version / "model.json").read_text())
    assert settings["enable_lora"] is True and settings["max_loras"] == 1
    assert reports[0].errors == []


def test_llamacpp_lora_adapters_go_to_multi_lora_json_with_their_gguf(
    tmp_path, models_root, repo_env
) -> None:
    """llama.cpp reads the adapter.gguf inside the directory: an adapter without one is
    refused by the check that follows add, and nothing is written."""
    gguf = str(models_root / "tiny.gguf")
    adapter = models_root / "adapters" / "pirate"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    req = request(
        tmp_path, models_root, engine="llamacpp", model=gguf, loras={"pirate": str(adapter)}
    )
    with pytest.raises(AddError, match=r"llama\.cpp needs .*adapter\.gguf"):
        add(req, repo_env, known)
    assert not (req.repository / "tiny").exists()
    (adapter / "adapter.gguf").write_bytes(b"GGUF")
    reports = add(req, repo_env, known)
    version = req.repository / "tiny" / "1"
    assert json.loads((version / "multi_lora.json").read_text()) == {
        "pirate": "$TRITONFORGE_MODELS/adapters/pirate"
    }
    assert "enable_lora" not in json.loads((version / "model.json").read_text())
    assert reports[0].errors == []


def test_lora_is_refused_for_other_engines_and_for_a_missing_adapter(
    tmp_path, models_root, repo_env
) -> None:
    with pytest.raises(AddError, match="--engine vllm or llamacpp only"):
        render(request(tmp_path, models_root, engine="synthetic", loras={"a": "/x"}), repo_env)
    with pytest.raises(AddError, match=r"no adapter_config\.json"):
        add(request(tmp_path, models_root, loras={"a": str(tmp_path)}), repo_env, known)


# --- what is refused -----------------------------------------------------------------


def test_an_existing_model_is_not_clobbered_without_force(tmp_path, models_root, repo_env) -> None:
    req = request(tmp_path, models_root)
    add(req, repo_env, known)
    marker = req.repository / "tiny" / "mine.txt"
    marker.write_text("keep")
    with pytest.raises(AddError, match=r"already in .* --force"):
        add(request(tmp_path, models_root, max_inflight=3), repo_env, known)
    assert marker.read_text() == "keep"
    add(request(tmp_path, models_root, max_inflight=3, force=True), repo_env, known)
    assert not marker.exists()  # replaced whole, not merged
    config = pbtxt.read(req.repository / "tiny" / "config.pbtxt")
    assert pbtxt.parameters(config)["max_inflight"] == "3"


def test_force_replaces_a_symlinked_model(tmp_path, models_root, repo_env) -> None:
    repository = tmp_path / "repo"
    repository.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (repository / "tiny").symlink_to(tmp_path / "elsewhere")
    add(request(tmp_path, models_root, force=True), repo_env, known)
    assert not (repository / "tiny").is_symlink()
    assert (tmp_path / "elsewhere").is_dir()  # the link's target is left alone


def test_a_model_that_would_not_load_is_not_written(tmp_path, models_root, repo_env) -> None:
    req = request(tmp_path, models_root, engine_args={"max_model_length": 64})
    with pytest.raises(AddError, match=r"'max_model_length'.*did you mean 'max_model_len'"):
        add(req, repo_env, known)
    assert list(req.repository.iterdir()) == []  # no model, no staging left behind


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": "bad/name"}, "model name 'bad/name' is not allowed"),
        ({"name": ".hidden"}, "is not allowed"),
        ({"engine": "tgi"}, "--engine must be one of"),
        ({"instances": 0}, "--instances must be >= 1"),
        ({"max_inflight": 0}, "--max-inflight must be >= 1"),
        ({"engine_args": {"model": "/x"}}, "give the model with --model"),
        (
            {"engine": "tensorrt_llm", "engine_args": {"triton_config": {}}},
            "triton_config: written by the tool",
        ),
        ({"model": "/does/not/exist"}, "model directory /does/not/exist does not exist"),
        ({"model": "$NO_SUCH_VAR/x"}, "NO_SUCH_VAR .* is not set"),
    ],
)
def test_bad_requests_are_refused_with_a_message(
    tmp_path, models_root, repo_env, changes, message
) -> None:
    with pytest.raises(AddError, match=message):
        add(request(tmp_path, models_root, **changes), repo_env, known)


def test_a_file_where_the_repository_should_be_is_refused(tmp_path, models_root, repo_env) -> None:
    (tmp_path / "repo").write_text("")
    with pytest.raises(AddError, match="is not a directory"):
        add(request(tmp_path, models_root), repo_env, known)


def test_command_line_values() -> None:
    assert parse_assignment("a=b=c", "--engine-arg") == ("a", "b=c")
    with pytest.raises(AddError, match="--lora: expected KEY=VALUE"):
        parse_assignment("novalue", "--lora")
    assert engine_arg_value("2048") == 2048
    assert engine_arg_value("true") is True
    assert engine_arg_value("bfloat16") == "bfloat16"
    assert engine_arg_value("[1, 2]") == [1, 2]


# --- the tables agree with the code they stand for ----------------------------------


def test_engine_table_matches_the_adapters_config_files() -> None:
    from tritonforge.engines.llamacpp import LlamaCppEngine
    from tritonforge.engines.synthetic import SyntheticEngine
    from tritonforge.engines.tensorrtllm import TensorRTLLMEngine

    adapters = (
        ("llamacpp", LlamaCppEngine),
        ("tensorrt_llm", TensorRTLLMEngine),
        ("synthetic", SyntheticEngine),
    )
    for key, adapter in adapters:
        spec = ENGINES[key]
        assert spec.config_file == adapter.config_file.name
        assert spec.path_keys == adapter.config_file.path_keys
    # vLLM's adapter imports vLLM (slow): compare with its source instead.
    source = (Path(__file__).parents[3] / "tritonforge" / "engines" / "vllm.py").read_text()
    assert 'ConfigFile("model.json", path_keys=("model", "tokenizer"))' in source


def test_the_llamacpp_argument_list_is_read_from_the_installed_engine() -> None:
    from tritonforge.repo.engines import _llamacpp_args

    pytest.importorskip("llama_cpp")
    args = _llamacpp_args()
    assert {"model_path", "n_ctx", "n_threads", "n_parallel", "kv_unified"} <= args.names
    assert "kwargs" not in args.names and "self" not in args.names


def test_the_tensorrt_llm_argument_list_is_torch_llm_args_fields(monkeypatch) -> None:
    """Against a stand-in of tensorrt_llm.llmapi.llm_args (TensorRT-LLM needs a GPU):
    LLM(**kwargs) with the PyTorch backend validates its keywords as TorchLlmArgs."""
    from tritonforge.repo.engines import _tensorrt_llm_args

    trtllm = types.ModuleType("tensorrt_llm")
    trtllm.__version__ = "9.9"
    llm_args = types.ModuleType("tensorrt_llm.llmapi.llm_args")
    # A pydantic model: its fields are model_fields.
    fields = {"model": None, "backend": None, "max_seq_len": None}
    llm_args.TorchLlmArgs = types.SimpleNamespace(model_fields=fields)
    monkeypatch.setitem(sys.modules, "tensorrt_llm", trtllm)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi.llm_args", llm_args)
    args = _tensorrt_llm_args()
    assert args.names == {"model", "backend", "max_seq_len"}
    assert args.source == "TensorRT-LLM 9.9 TorchLlmArgs"


def test_an_engine_that_is_not_installed_is_reported_not_raised(monkeypatch) -> None:
    from tritonforge.repo import engines

    monkeypatch.setattr(engines, "is_installed", lambda module: False)
    engines.known_args.cache_clear()
    try:
        assert engines.known_args("tensorrt_llm") == "TensorRT-LLM is not installed here"
    finally:
        engines.known_args.cache_clear()
