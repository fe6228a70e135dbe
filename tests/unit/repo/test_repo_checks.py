"""``python -m tritonforge.repo check``/``list``: one test per check, in the user's terms.

Each test starts from a model ``add`` wrote (so it passes every check), breaks one
thing the way a user would, and asserts the message names the file and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tritonforge.launch.launcher import MODEL_REPOSITORY
from tritonforge.launch.model_store import DEFAULT_MODEL_NAME, models_dir
from tritonforge.repo import cli
from tritonforge.repo.checks import ModelReport, check_repository
from tritonforge.repo.engines import KnownArgs
from tritonforge.repo.generate import AddError, AddRequest, add

KNOWN = {
    "vllm": KnownArgs(
        frozenset({"model", "tokenizer", "dtype", "enable_lora", "max_loras"}), "stand-in"
    ),
    "llamacpp": KnownArgs(frozenset({"model_path", "n_ctx", "n_parallel"}), "stand-in"),
    "tensorrt_llm": KnownArgs(frozenset({"model", "backend"}), "stand-in"),
}


def known(engine: str) -> KnownArgs:
    return KNOWN[engine]


@pytest.fixture
def repo(tmp_path: Path, models_root: Path, repo_env: dict[str, str]) -> Path:
    """A repository ``add`` wrote: a vLLM model with its ensemble, and a llama.cpp model."""
    root = tmp_path / "repo"
    hf, gguf = str(models_root / "tiny-hf"), str(models_root / "tiny.gguf")
    add(AddRequest("vllm", hf, "tiny", root, tokenizer_ensemble=True), repo_env, known)
    add(AddRequest("llamacpp", gguf, "gguf", root), repo_env, known)
    add(AddRequest("tensorrt_llm", hf, "trt", root), repo_env, known)
    return root


def check(root: Path, env: dict[str, str], provider=known) -> dict[str, ModelReport]:
    return {r.name: r for r in check_repository(root, env, provider)}


def errors(root: Path, env: dict[str, str], name: str, provider=known) -> list[str]:
    return check(root, env, provider)[name].errors


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new))


def write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value))


def test_a_generated_repository_passes(repo, repo_env) -> None:
    reports = check(repo, repo_env)
    assert sorted(reports) == [
        "ensemble_tiny",
        "gguf",
        "tiny",
        "tiny_postprocessing",
        "tiny_preprocessing",
        "trt",
    ]
    assert {n: r.errors for n, r in reports.items() if r.errors} == {}
    assert reports["tiny"].kind == "vllm" and reports["tiny"].instances == 1
    assert reports["tiny"].model == "$TRITONFORGE_MODELS/tiny-hf"
    assert reports["ensemble_tiny"].model == "tiny_preprocessing → tiny → tiny_postprocessing"


# --- config.pbtxt ------------------------------------------------------------------


def test_missing_config(repo, repo_env) -> None:
    (repo / "tiny" / "config.pbtxt").unlink()
    assert errors(repo, repo_env, "tiny") == ["config.pbtxt is missing"]


def test_config_that_does_not_parse_says_where(repo, repo_env) -> None:
    edit(repo / "tiny" / "config.pbtxt", "max_batch_size: 0", "max_batch_sise: 0")
    [message] = errors(repo, repo_env, "tiny")
    assert message.startswith("config.pbtxt: not valid protobuf text for Triton:")
    assert "max_batch_sise" in message


def test_name_in_config_must_match_the_directory(repo, repo_env) -> None:
    (repo / "tiny").rename(repo / "renamed")
    [message] = errors(repo, repo_env, "renamed")
    assert "names the model 'tiny' but its directory is 'renamed'" in message


def test_directory_name_must_be_a_usable_model_name(repo, repo_env) -> None:
    (repo / "tiny").rename(repo / "tiny model")
    edit(repo / "tiny model" / "config.pbtxt", 'name: "tiny"', 'name: "tiny model"')
    assert any(
        "model name 'tiny model' is not allowed" in e for e in errors(repo, repo_env, "tiny model")
    )


def test_llm_model_must_be_decoupled_and_unbatched(repo, repo_env) -> None:
    config = repo / "tiny" / "config.pbtxt"
    edit(config, "model_transaction_policy { decoupled: true }", "")
    edit(config, "max_batch_size: 0", "max_batch_size: 8")
    found = errors(repo, repo_env, "tiny")
    assert any("model_transaction_policy { decoupled: true }" in e for e in found)
    assert any("max_batch_size must be 0" in e and "got 8" in e for e in found)


@pytest.mark.parametrize(
    ("parameter", "value", "message"),
    [
        ("max_inflight", "many", "max_inflight must be a whole number >= 1, got 'many'"),
        ("max_inflight", "0", "max_inflight must be a whole number >= 1, got '0'"),
        ("engine_restart_max", "-1", "parameter engine_restart_max: must be >= 0"),
        ("engine_restart_backoff_s", "soon", "engine_restart_backoff_s: expected a number"),
        ("stream_interval", "0", "parameter stream_interval: must be a whole number of tokens"),
        ("stream_coalescing", "yes", "parameter stream_coalescing: must be true or false"),
    ],
)
def test_bad_parameters(repo, repo_env, parameter, value, message) -> None:
    with (repo / "tiny" / "config.pbtxt").open("a") as config:
        config.write(f'parameters {{ key: "{parameter}" value: {{ string_value: "{value}" }} }}\n')
    if parameter == "max_inflight":
        edit(repo / "tiny" / "config.pbtxt", 'string_value: "256"', f'string_value: "{value}"')
    assert any(message in e for e in errors(repo, repo_env, "tiny"))


# --- engine settings -----------------------------------------------------------------


def test_missing_version_directory(repo, repo_env) -> None:
    (repo / "gguf" / "1" / "model.json").unlink()
    (repo / "gguf" / "1").rmdir()
    assert errors(repo, repo_env, "gguf") == ["no version directory: llama.cpp reads 1/model.json"]


def test_missing_engine_file(repo, repo_env) -> None:
    (repo / "trt" / "1" / "model.yaml").unlink()
    assert errors(repo, repo_env, "trt") == [
        "1/model.yaml is missing: it holds the TensorRT-LLM engine arguments"
    ]


def test_engine_file_that_does_not_parse(repo, repo_env) -> None:
    (repo / "tiny" / "1" / "model.json").write_text('{"model": ')
    [message] = errors(repo, repo_env, "tiny")
    assert message.startswith("1/model.json is not valid")


def test_unset_variable_is_named(repo, repo_env) -> None:
    write_json(repo / "tiny" / "1" / "model.json", {"model": "$MY_MODELS/tiny-hf"})
    assert errors(repo, repo_env, "tiny") == [
        "1/model.json: model: environment variable MY_MODELS (used in '$MY_MODELS/tiny-hf') "
        "is not set"
    ]


def test_variables_expand_from_the_given_environment(repo, repo_env, models_root) -> None:
    write_json(repo / "tiny" / "1" / "model.json", {"model": "$MY_MODELS/tiny-hf"})
    assert errors(repo, repo_env | {"MY_MODELS": str(models_root)}, "tiny") == []


def test_missing_model_directory(repo, repo_env) -> None:
    write_json(repo / "tiny" / "1" / "model.json", {"model": "$TRITONFORGE_MODELS/gone"})
    [message] = errors(repo, repo_env, "tiny")
    assert message.startswith("1/model.json: model: model directory $TRITONFORGE_MODELS/gone (")
    assert message.endswith("/gone) does not exist")


def test_model_directory_without_config_json(repo, repo_env, models_root) -> None:
    (models_root / "tiny-hf" / "config.json").unlink()
    found = errors(repo, repo_env, "trt")
    assert len(found) == 1 and "has no config.json — not a HuggingFace model directory" in found[0]


def test_relative_paths_resolve_against_the_version_directory(repo, repo_env, models_root) -> None:
    (repo / "gguf" / "1" / "local.gguf").write_bytes(b"GGUF")
    write_json(repo / "gguf" / "1" / "model.json", {"model_path": "local.gguf"})
    assert errors(repo, repo_env, "gguf") == []
    write_json(repo / "gguf" / "1" / "model.json", {"model_path": "other.gguf"})
    [message] = errors(repo, repo_env, "gguf")
    assert f"GGUF file other.gguf ({repo}/gguf/1/other.gguf) does not exist" in message


def test_a_file_that_is_not_a_gguf(repo, repo_env, models_root) -> None:
    (models_root / "tiny.gguf").write_bytes(b"PK\x03\x04 a zip file")
    [message] = errors(repo, repo_env, "gguf")
    assert "tiny.gguf" in message and message.endswith("is not a GGUF file")


def test_a_missing_tokenizer_path_argument(repo, repo_env) -> None:
    settings = {"model": "$TRITONFORGE_MODELS/tiny-hf", "tokenizer": "/no/tokenizer"}
    write_json(repo / "tiny" / "1" / "model.json", settings)
    assert errors(repo, repo_env, "tiny") == [
        "1/model.json: tokenizer: /no/tokenizer does not exist"
    ]


def test_unknown_engine_argument_suggests_the_known_one(repo, repo_env) -> None:
    write_json(
        repo / "gguf" / "1" / "model.json",
        {"model_path": "$TRITONFORGE_MODELS/tiny.gguf", "n_ctxx": 2048, "zzz": 1},
    )
    assert errors(repo, repo_env, "gguf") == [
        "1/model.json: 'n_ctxx' is not a llama.cpp engine argument (did you mean 'n_ctx'?) "
        "[stand-in]",
        "1/model.json: 'zzz' is not a llama.cpp engine argument [stand-in]",
    ]


def test_an_engine_that_is_not_installed_is_a_note_not_a_problem(repo, repo_env) -> None:
    (repo / "trt" / "requires.txt").write_text("tritonforge_no_such_module\n")
    report = check(repo, repo_env, lambda engine: "TensorRT-LLM is not installed here")["trt"]
    assert report.errors == []
    assert report.notes == [
        "tritonforge_no_such_module not installed here: `python -m tritonforge.launch.launcher` "
        "leaves this model out on this machine",
        "engine arguments not checked: TensorRT-LLM is not installed here",
    ]
    assert report.state == "ok, partly unchecked"


def test_tensorrt_llm_triton_section_is_checked(repo, repo_env) -> None:
    path = repo / "trt" / "1" / "model.yaml"
    edit(path, "decoupled: true", "decoupled: false")
    [message] = errors(repo, repo_env, "trt")
    assert message.startswith("1/model.yaml: triton_config.decoupled must be true")


# --- LoRA --------------------------------------------------------------------------


@pytest.fixture
def adapter(models_root: Path) -> Path:
    path = models_root / "adapters" / "pirate"
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text("{}")
    return path


def test_multi_lora_json_needs_enable_lora(repo, repo_env, adapter) -> None:
    write_json(repo / "tiny" / "1" / "multi_lora.json", {"pirate": str(adapter)})
    assert errors(repo, repo_env, "tiny") == [
        '1/multi_lora.json lists adapters but 1/model.json does not set "enable_lora": true'
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{nope", "1/multi_lora.json is not valid JSON"),
        ('["a"]', '1/multi_lora.json must map adapter names to directories: {"name": "/path"}'),
        ('{"a b": "ADAPTER"}', "1/multi_lora.json: adapter name 'a b' is not allowed"),
        ('{"gone": "/no/adapter"}', "adapter 'gone': /no/adapter is not a PEFT adapter directory"),
    ],
)
def test_bad_multi_lora_json(repo, repo_env, adapter, content, message) -> None:
    settings = {"model": "$TRITONFORGE_MODELS/tiny-hf", "enable_lora": True}
    write_json(repo / "tiny" / "1" / "model.json", settings)
    (repo / "tiny" / "1" / "multi_lora.json").write_text(content.replace("ADAPTER", str(adapter)))
    assert any(message in e for e in errors(repo, repo_env, "tiny"))


def test_llamacpp_adapters_need_their_gguf(repo, repo_env, adapter) -> None:
    write_json(repo / "gguf" / "1" / "multi_lora.json", {"pirate": str(adapter)})
    assert errors(repo, repo_env, "gguf") == [
        f"1/multi_lora.json: adapter 'pirate': llama.cpp needs {adapter}/adapter.gguf (a GGUF LoRA)"
    ]


# --- tokenizer models, python models, ensembles ------------------------------------


def test_tokenizer_file_missing(repo, repo_env, models_root) -> None:
    (models_root / "tiny-hf" / "tokenizer.json").unlink()
    for name in ("tiny_preprocessing", "tiny_postprocessing"):
        assert errors(repo, repo_env, name) == [
            "config.pbtxt: tokenizer_file $TRITONFORGE_MODELS/tiny-hf/tokenizer.json does not exist"
        ]


def test_tokenizer_the_cpp_backend_refuses(repo, repo_env, models_root) -> None:
    pytest.importorskip("tritonforge_tokenizer")  # built by scripts/build_tokenizer.sh
    path = models_root / "tiny-hf" / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    tokenizer["model"]["type"] = "WordPiece"
    write_json(path, tokenizer)
    [message] = errors(repo, repo_env, "tiny_preprocessing")
    assert "the C++ tokenizer cannot load it" in message and "WordPiece" in message


def test_tokenizer_parameter_missing(repo, repo_env) -> None:
    config = repo / "tiny_postprocessing" / "config.pbtxt"
    text = config.read_text()
    config.write_text("\n".join(line for line in text.splitlines() if "tokenizer_file" not in line))
    assert errors(repo, repo_env, "tiny_postprocessing") == [
        "config.pbtxt: parameter tokenizer_file (a tokenizer.json) is missing"
    ]


def test_python_model_without_model_py(tmp_path, repo_env) -> None:
    model = tmp_path / "repo" / "guard"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('backend: "python"\n')
    assert errors(tmp_path / "repo", repo_env, "guard") == [
        "a python-backend model needs 1/model.py (none found)"
    ]
    (model / "1" / "model.py").write_text("")
    assert errors(tmp_path / "repo", repo_env, "guard") == []


def test_ensemble_step_naming_a_missing_model(repo, repo_env) -> None:
    edit(repo / "ensemble_tiny" / "config.pbtxt", '"tiny_postprocessing"', '"tiny_post"')
    assert errors(repo, repo_env, "ensemble_tiny") == [
        "step 3 (tiny_post): no model 'tiny_post' in this repository"
    ]


def test_ensemble_step_tensor_the_model_does_not_have(repo, repo_env) -> None:
    edit(repo / "ensemble_tiny" / "config.pbtxt", 'key: "output_ids"', 'key: "token_ids"')
    found = errors(repo, repo_env, "ensemble_tiny")
    assert "step 2 (tiny): tiny has no output 'token_ids'" in found
    assert "step 3 (tiny_postprocessing): tiny_postprocessing has no input 'token_ids'" in found


def test_ensemble_data_flow(repo, repo_env) -> None:
    config = repo / "ensemble_tiny" / "config.pbtxt"
    edit(
        config,
        'output_map { key: "output_ids" value: "_output_ids" }',
        'output_map { key: "output_ids" value: "_ids" }',
    )
    found = errors(repo, repo_env, "ensemble_tiny")
    assert found == [
        "step 3 (tiny_postprocessing): input 'output_ids' reads '_output_ids', which neither "
        "the ensemble's inputs nor an earlier step provide"
    ]
    edit(config, 'value: "text_output"', 'value: "text"')
    assert "output 'text_output' is produced by no step" in errors(repo, repo_env, "ensemble_tiny")


def test_hidden_directories_and_files_are_not_models(repo, repo_env) -> None:
    (repo / ".staging").mkdir()
    (repo / "README.md").write_text("")
    assert ".staging" not in check(repo, repo_env) and "README.md" not in check(repo, repo_env)


def test_a_repository_that_is_not_there(tmp_path, repo_env) -> None:
    [report] = check_repository(tmp_path / "nope", repo_env, known)
    assert report.errors == [f"repository {tmp_path / 'nope'} does not exist or is not a directory"]


def test_the_shipped_repository_passes() -> None:
    """model_repository/ as this clone serves it (engine arguments: llama.cpp only here)."""
    if not (models_dir() / DEFAULT_MODEL_NAME / "config.json").is_file():
        pytest.skip("the default model is not converted (make serve does it)")
    from tritonforge.repo.engines import known_args
    from tritonforge.repo.paths import server_environment

    def without_slow_imports(engine: str) -> KnownArgs | str:
        return known_args(engine) if engine == "llamacpp" else "not imported by this test"

    reports = check_repository(MODEL_REPOSITORY, server_environment(), without_slow_imports)
    assert {r.name: r.errors for r in reports if r.errors} == {}
    assert {r.name for r in reports} >= {"vllm_model", "llamacpp_model", "ensemble_vllm"}


# --- the command line --------------------------------------------------------------


def use_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """The CLI reads the process environment; engine arguments come from the stand-in."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr("tritonforge.repo.engines.known_args", known)


def test_cli_check_exit_code_and_messages(repo, repo_env, monkeypatch, capsys) -> None:
    use_env(monkeypatch, repo_env)
    assert cli.main(["check", "--repository", str(repo)]) == 0
    assert capsys.readouterr().out.strip().endswith("all 6 models ok")
    edit(repo / "ensemble_tiny" / "config.pbtxt", '"tiny_postprocessing"', '"tiny_post"')
    assert cli.main(["check", "--repository", str(repo)]) == 1
    out = capsys.readouterr().out
    assert "ensemble_tiny (ensemble): 1 problem\n  - step 3 (tiny_post): no model" in out
    assert out.strip().endswith("1 of 6 models have problems")
    assert cli.main(["list", "--repository", str(repo)]) == 0  # list reports, never fails


def test_cli_list_json(repo, repo_env, monkeypatch, capsys) -> None:
    use_env(monkeypatch, repo_env)
    assert cli.main(["list", "--json", "--repository", str(repo)]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["gguf"]["kind"] == "llamacpp"
    assert rows["gguf"]["model"] == "$TRITONFORGE_MODELS/tiny.gguf"
    assert rows["gguf"]["instances"] == 1
    assert rows["tiny_preprocessing"]["instances"] == 2


def test_cli_add_refusal_is_one_line_on_stderr(tmp_path, repo_env, monkeypatch, capsys) -> None:
    use_env(monkeypatch, repo_env)
    model, repository = str(tmp_path / "nope"), str(tmp_path / "repo")
    code = cli.main(
        ["add", "--engine", "vllm", "--model", model, "--name", "x", "--repository", repository]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: not written, the new model would not load:")
    assert "model directory" in err and "does not exist" in err


def test_a_synthetic_model_needs_a_tokenizer_directory(tmp_path, models_root, repo_env) -> None:
    root = tmp_path / "synthetic-repo"
    tokenizer = models_root / "tiny-hf"
    request = AddRequest("synthetic", "$TRITONFORGE_MODELS/tiny-hf", "sim", root)
    with pytest.raises(AddError, match=r"tiny-hf .* has no tokenizer_config\.json"):
        add(request, repo_env, known_synthetic)
    (tokenizer / "tokenizer_config.json").write_text("{}")
    add(request, repo_env, known_synthetic)
    report = check(root, repo_env, known_synthetic)["sim"]
    assert report.kind == "synthetic" and report.errors == []
    edit(root / "sim" / "1" / "model.json", '"tokenizer"', '"step_ms": 1, "tokeniser"')
    problems = errors(root, repo_env, "sim", known_synthetic)
    assert any("'tokeniser' is not a synthetic engine argument" in e for e in problems)


def known_synthetic(engine: str) -> KnownArgs:
    """The synthetic engine's real settings list (reading it imports nothing heavy)."""
    from tritonforge.repo.engines import known_args

    return known_args(engine)


def test_chat_template_must_load(repo, repo_env) -> None:
    version = repo / "gguf" / "1"
    settings = json.loads((version / "model.json").read_text())
    write_json(version / "model.json", {**settings, "chat_template": "chat.jinja"})
    [missing] = errors(repo, repo_env, "gguf")
    assert (
        missing.startswith("1/model.json: chat_template: chat_template ") and "missing" in missing
    )
    (version / "chat.jinja").write_text("{{ messages[0].content }}\n{% if %}")
    [broken] = errors(repo, repo_env, "gguf")
    assert broken.startswith("1/model.json: chat_template: chat.jinja: line 2: Expected")
    (version / "chat.jinja").write_text("{{ messages[0].content }}")
    assert errors(repo, repo_env, "gguf") == []
