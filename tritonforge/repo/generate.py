"""``add``: write a model (and optionally its tokenizer ensemble) into a repository.

Everything is written into a staging directory inside the repository first and
checked there with the same checks as ``check``; only a model that passes is moved
into place, so a failed ``add`` leaves the repository as it was. An existing model is
replaced only with ``force`` (a half-overwritten model directory is worse than none).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tritonforge.repo import pbtxt
from tritonforge.repo.checks import (
    LORA_FILE,
    KnownArgsProvider,
    ModelReport,
    Repository,
    check_model,
    name_problem,
)
from tritonforge.repo.engines import ENGINES, EngineSpec, known_args
from tritonforge.repo.paths import portable, resolve

#: Engines ``--lora`` writes adapters for: vLLM reads the PEFT directory, llama.cpp the
#: ``adapter.gguf`` inside it (the check that follows ``add`` says when it is missing).
LORA_ADD_ENGINES = ("vllm", "llamacpp")


class AddError(ValueError):
    """``add`` refused: the message says what to change (nothing was written)."""


@dataclass
class AddRequest:
    engine: str
    model: str  # as the user gave it (a path, or a $VAR path)
    name: str
    repository: Path
    instances: int = 1
    max_inflight: int | None = None  # None: the engine's shipped default
    engine_args: dict[str, Any] = field(default_factory=dict)
    loras: dict[str, str] = field(default_factory=dict)  # adapter name -> path as given
    tokenizer_ensemble: bool = False
    tokenizer: str | None = None  # tokenizer.json or a directory holding one
    force: bool = False

    @property
    def spec(self) -> EngineSpec:
        return ENGINES[self.engine]

    def ensemble_names(self) -> dict[str, str]:
        """The three extra models of --tokenizer-ensemble, named after the LLM model."""
        if not self.tokenizer_ensemble:
            return {}
        return {
            "preprocessing": f"{self.name}_preprocessing",
            "postprocessing": f"{self.name}_postprocessing",
            "ensemble": f"ensemble_{self.name}",
        }

    def names(self) -> list[str]:
        return [self.name, *self.ensemble_names().values()]


def parse_assignment(text: str, what: str) -> tuple[str, str]:
    """``KEY=VALUE`` → (key, value); an AddError names the flag otherwise."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise AddError(f"{what}: expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def engine_arg_value(text: str) -> Any:
    """A value from the command line: JSON when it is JSON (numbers, true, lists), else text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _validate(request: AddRequest) -> None:
    if request.engine not in ENGINES:
        raise AddError(f"--engine must be one of {', '.join(ENGINES)}, got {request.engine!r}")
    for name in request.names():
        if problem := name_problem(name):
            raise AddError(problem)
    if request.instances < 1:
        raise AddError(f"--instances must be >= 1, got {request.instances}")
    if request.max_inflight is not None and request.max_inflight < 1:
        raise AddError(f"--max-inflight must be >= 1, got {request.max_inflight}")
    if request.loras and request.engine not in LORA_ADD_ENGINES:
        raise AddError(
            f"--lora: LoRA adapters are configured for --engine {' or '.join(LORA_ADD_ENGINES)} "
            "only"
        )
    spec = request.spec
    if spec.model_key in request.engine_args:
        raise AddError(f"--engine-arg {spec.model_key}: give the model with --model")
    written = sorted(spec.file_keys & set(request.engine_args))
    if written:
        raise AddError(f"--engine-arg {written[0]}: written by the tool (streaming needs it)")
    if request.repository.exists() and not request.repository.is_dir():
        raise AddError(f"--repository {request.repository} is not a directory")
    taken = [n for n in request.names() if _exists(request.repository / n)]
    if taken and not request.force:
        raise AddError(
            f"{', '.join(taken)} already in {request.repository}: choose another --name, "
            "or pass --force to replace"
        )


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _tokenizer_file(request: AddRequest, env: Mapping[str, str]) -> str:
    """The tokenizer.json the ensemble's C++ steps load, written portably."""
    given = request.tokenizer
    if given is None:
        if request.spec.model_kind == "gguf":
            raise AddError(
                "--tokenizer-ensemble with --engine llamacpp needs --tokenizer PATH (a "
                "tokenizer.json, or the HF directory holding it): a GGUF keeps its tokenizer inside"
            )
        given = request.model
    written = portable(given, env)
    try:
        path = resolve(written, Path.cwd(), env)
    except ValueError as exc:
        raise AddError(f"--tokenizer: {exc}") from None
    if path.is_dir():
        path, written = path / "tokenizer.json", f"{written.rstrip('/')}/tokenizer.json"
    if not path.is_file():
        raise AddError(
            f"--tokenizer-ensemble: {path} does not exist (the C++ tokenizer reads an HF "
            "tokenizer.json; give it with --tokenizer)"
        )
    return written


def render(request: AddRequest, env: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """model name → {relative file path: text}: everything ``add`` writes."""
    _validate(request)
    spec = request.spec
    settings: dict[str, Any] = {spec.model_key: portable(request.model, env)}
    settings |= spec.defaults
    settings |= request.engine_args
    files: dict[str, str] = {}
    if request.loras:
        if request.engine == "vllm":  # llama.cpp loads adapters without settings
            settings["enable_lora"] = True
            settings.setdefault("max_loras", len(request.loras))
        adapters = {name: portable(path, env) for name, path in request.loras.items()}
        files[f"1/{LORA_FILE}"] = json.dumps(adapters, indent=2) + "\n"
    if spec.config_file.endswith(".yaml"):
        engine_text = (
            f"# {spec.label} engine arguments (upstream llmapi format): every key except\n"
            "# triton_config goes to tensorrt_llm.LLM(**kwargs). Generated by\n"
            "# `python -m tritonforge.repo add`.\n" + yaml.safe_dump(settings, sort_keys=False)
        )
    else:
        engine_text = json.dumps(settings, indent=2) + "\n"
    files[f"1/{spec.config_file}"] = engine_text
    files["requires.txt"] = spec.module + "\n"
    extra_inputs: tuple[dict[str, Any], ...] = ()
    if spec.key == "tensorrt_llm":
        from tritonforge.serving.dialects.tensorrtllm import INPUTS as TRTLLM_INPUTS

        extra_inputs = tuple(TRTLLM_INPUTS)
    files["config.pbtxt"] = pbtxt.llm_config(
        request.name,
        spec.backend,
        spec.label,
        spec.config_file,
        request.instances,
        request.max_inflight or spec.max_inflight,
        extra_inputs,
    )
    models = {request.name: files}
    names = request.ensemble_names()
    if names:
        tokenizer = _tokenizer_file(request, env)
        version_dir = {"1/.gitkeep": ""}  # Triton needs a version directory for every model
        models[names["preprocessing"]] = {
            "config.pbtxt": pbtxt.preprocessing_config(names["preprocessing"], tokenizer),
            **version_dir,
        }
        models[names["postprocessing"]] = {
            "config.pbtxt": pbtxt.postprocessing_config(names["postprocessing"], tokenizer),
            **version_dir,
        }
        models[names["ensemble"]] = {
            "config.pbtxt": pbtxt.ensemble_config(
                names["ensemble"], request.name, names["preprocessing"], names["postprocessing"]
            ),
            **version_dir,
        }
    return models


def add(
    request: AddRequest, env: Mapping[str, str], known: KnownArgsProvider = known_args
) -> list[ModelReport]:
    """Render, check in staging, then move into the repository. AddError if a check fails.

    Returns the reports of the written models (their notes: what could not be checked).
    """
    models = render(request, env)
    request.repository.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tritonforge-add-", dir=request.repository))
    try:
        for name, files in models.items():
            for relative, text in files.items():
                path = staging / name / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
        repo = Repository(staging, env, known)
        reports = []
        for name in models:
            repo.configs[name] = pbtxt.read(staging / name / "config.pbtxt")
        for name in models:
            report = ModelReport(name=name)
            check_model(repo, staging / name, repo.configs[name], report)
            reports.append(report)
        problems = [f"{r.name}: {e}" for r in reports for e in r.errors]
        if problems:
            raise AddError("not written, the new model would not load:\n  " + "\n  ".join(problems))
        for name in models:
            target = request.repository / name
            if target.is_symlink() or target.is_file():
                target.unlink()
            elif target.exists():
                shutil.rmtree(target)
            (staging / name).rename(target)
        return reports
    finally:
        shutil.rmtree(staging, ignore_errors=True)
