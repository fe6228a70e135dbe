"""Check a model repository before Triton loads it, and say what is wrong per model.

Triton reports a bad model as a load failure with a stub traceback, minutes into a
start when vLLM is involved. Most of those failures are visible from the files alone:
a config.pbtxt that does not parse, a model directory without ``config.json``, a GGUF
path that is not a GGUF, an ``$VAR`` that is not set, an engine argument the installed
engine does not know, an ensemble step naming a model that is not there. Each check
here produces a message in the user's terms (the file, the key, what to do).

Two severities: an *error* is something Triton or the engine will refuse; a *note* is
something this machine could not check (an engine that is not installed here), which
is not a problem of the repository.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tritonforge.engines.base import CHAT_TEMPLATE_KEY
from tritonforge.engines.config import load_engine_config
from tritonforge.engines.lora import GGUF_ADAPTER_FILE, LORA_FILE
from tritonforge.repo import pbtxt
from tritonforge.repo.engines import BY_BACKEND, EngineSpec, KnownArgs, is_installed, known_args
from tritonforge.repo.paths import resolve
from tritonforge.serving.admission import AdmissionSettings, model_defaults
from tritonforge.serving.chat import ChatTemplate
from tritonforge.serving.outbox import StreamPolicy
from tritonforge.serving.restarts import RestartPolicy

#: Names that work as a directory, in Triton's URLs (/v2/models/<name>) and in metrics.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
GGUF_MAGIC = b"GGUF"
#: Engines whose adapters serve LoRA (tritonforge.engines.lora).
LORA_ENGINES = ("vllm", "llamacpp", "tensorrt_llm")

KnownArgsProvider = Callable[[str], KnownArgs | str]


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a model name, or None."""
    if not NAME_PATTERN.fullmatch(name):
        return (
            f"model name {name!r} is not allowed: use letters, digits, '_', '-' and '.', "
            "starting with a letter or digit, at most 128 characters"
        )
    return None


@dataclass
class Finding:
    severity: Literal["error", "note"]
    message: str


@dataclass
class ModelReport:
    """One model directory: what it is and what the checks found."""

    name: str
    kind: str = "?"  # engine key, "ensemble", "tokenizer", "python" or the backend's name
    model: str | None = None  # the model (or tokenizer, or the chain) as the files name it
    instances: int | None = None
    findings: list[Finding] = field(default_factory=list)

    def error(self, message: str) -> None:
        self.findings.append(Finding("error", message))

    def note(self, message: str) -> None:
        self.findings.append(Finding("note", message))

    @property
    def errors(self) -> list[str]:
        return [f.message for f in self.findings if f.severity == "error"]

    @property
    def notes(self) -> list[str]:
        return [f.message for f in self.findings if f.severity == "note"]

    @property
    def state(self) -> str:
        """One word or two for ``list``."""
        if self.errors:
            count = len(self.errors)
            return f"{count} problem{'s' if count > 1 else ''}"
        return "ok, partly unchecked" if self.notes else "ok"


@dataclass
class Repository:
    """What checking one model needs to know about the others."""

    root: Path
    env: Mapping[str, str]
    known: KnownArgsProvider = known_args
    configs: dict[str, Any] = field(default_factory=dict)  # name -> parsed config (or None)
    _tokenizers: dict[Path, str | None] = field(default_factory=dict)

    def tokenizer_problem(self, path: Path) -> str | None:
        """Load a tokenizer.json with the C++ core the backend uses (once per file)."""
        if path not in self._tokenizers:
            self._tokenizers[path] = _load_tokenizer(path)
        return self._tokenizers[path]


def _load_tokenizer(path: Path) -> str | None:
    try:
        import tritonforge_tokenizer
    except ImportError:
        return None  # the backend's own check runs at load; the file exists at least
    try:
        tritonforge_tokenizer.Tokenizer.from_file(str(path))
    except tritonforge_tokenizer.TokenizerError as exc:
        return f"the C++ tokenizer cannot load it: {exc}"
    return None


def model_dirs(root: Path) -> list[Path]:
    """The repository's model directories (hidden ones and plain files are not models)."""
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "__")))


def latest_version(model_dir: Path) -> Path | None:
    """The version Triton serves by default (the highest number)."""
    versions = [p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    return max(versions, key=lambda p: int(p.name)) if versions else None


def check_repository(
    root: Path, env: Mapping[str, str], known: KnownArgsProvider = known_args
) -> list[ModelReport]:
    """Every model in ``root``, checked; ensembles against the models beside them."""
    repo = Repository(root, env, known)
    if not root.is_dir():
        report = ModelReport(name=str(root))
        report.error(f"repository {root} does not exist or is not a directory")
        return [report]
    reports: dict[str, ModelReport] = {}
    for model_dir in model_dirs(root):
        report = reports[model_dir.name] = ModelReport(name=model_dir.name)
        config_path = model_dir / "config.pbtxt"
        repo.configs[model_dir.name] = None
        if not config_path.is_file():
            report.error("config.pbtxt is missing")
            continue
        try:
            repo.configs[model_dir.name] = pbtxt.read(config_path)
        except pbtxt.ConfigError as exc:
            report.error(str(exc).replace(str(config_path), "config.pbtxt"))
    for name, report in reports.items():
        if repo.configs[name] is not None:
            check_model(repo, root / name, repo.configs[name], report)
    return list(reports.values())


def check_model(repo: Repository, model_dir: Path, config: Any, report: ModelReport) -> None:
    name = model_dir.name
    if problem := name_problem(name):
        report.error(problem)
    if config.name and config.name != name:
        report.error(
            f"config.pbtxt names the model {config.name!r} but its directory is {name!r}: "
            "Triton refuses the model; make them equal"
        )
    _check_requires(model_dir, report)
    if config.platform == "ensemble":
        report.kind = "ensemble"
        _check_ensemble(repo, config, report)
        return
    report.instances = sum(g.count or 1 for g in config.instance_group) or 1
    spec = BY_BACKEND.get(config.backend)
    if spec is not None:
        report.kind = spec.key
        _check_llm(repo, model_dir, config, spec, report)
    elif config.backend == "tokenizer":
        report.kind = "tokenizer"
        _check_tokenizer(repo, model_dir, config, report)
    elif config.backend == "python":
        report.kind = "python"
        version = latest_version(model_dir)
        if version is None or not (version / "model.py").is_file():
            report.error("a python-backend model needs 1/model.py (none found)")
    else:
        report.kind = config.backend or config.platform or "?"
        report.note(f"backend {report.kind!r}: only the config's syntax was checked")


def _check_requires(model_dir: Path, report: ModelReport) -> None:
    needs = model_dir / "requires.txt"
    if not needs.is_file():
        return
    missing = [m for m in needs.read_text().split() if not is_installed(m)]
    if missing:
        report.note(
            f"{', '.join(missing)} not installed here: `python -m tritonforge.launch.launcher` "
            "leaves this model out on this machine"
        )


# --- LLM models --------------------------------------------------------------------


def _check_llm(
    repo: Repository, model_dir: Path, config: Any, spec: EngineSpec, report: ModelReport
) -> None:
    if not config.model_transaction_policy.decoupled:
        report.error(
            "config.pbtxt: set model_transaction_policy { decoupled: true } — LLM models "
            "stream and batch inside the engine"
        )
    if config.max_batch_size != 0:
        report.error(
            f"config.pbtxt: max_batch_size must be 0 (the engine batches in flight), "
            f"got {config.max_batch_size}"
        )
    params = pbtxt.parameters(config)
    raw = params.get("max_inflight", "").strip()
    if raw and (not raw.isdigit() or int(raw) < 1):
        report.error(
            f"config.pbtxt: parameter max_inflight must be a whole number >= 1, got {raw!r}"
        )
    checks = (
        RestartPolicy.from_parameters,
        AdmissionSettings.from_parameters,
        model_defaults,
        StreamPolicy.from_parameters,
    )
    for check in checks:
        try:
            check(params)
        except ValueError as exc:  # RequestError too: a default_<key> the schema refuses
            report.error(f"config.pbtxt: {exc}")

    version = latest_version(model_dir)
    if version is None:
        report.error(f"no version directory: {spec.label} reads 1/{spec.config_file}")
        return
    where = f"{version.name}/{spec.config_file}"
    try:
        settings = load_engine_config(version, spec.config_file)
    except FileNotFoundError:
        report.error(f"{where} is missing: it holds the {spec.label} engine arguments")
        return
    except ValueError as exc:
        report.error(str(exc).replace(str(version / spec.config_file), where))
        return
    if spec.key == "tensorrt_llm":
        from tritonforge.engines.tensorrtllm import split_model_yaml

        try:
            split_model_yaml(settings)
        except ValueError as exc:
            report.error(str(exc).replace("model.yaml", where))
    _check_model_path(repo, version, where, settings, spec, report)
    _check_engine_args(repo, where, settings, spec, report)
    _check_chat_template(repo, version, where, settings, report)
    _check_lora(repo, version, settings, spec, report)


def _check_chat_template(
    repo: Repository, version: Path, where: str, settings: Mapping[str, Any], report: ModelReport
) -> None:
    """A ``chat_template`` the engine core would fail to load fails the check instead."""
    value = settings.get(CHAT_TEMPLATE_KEY)
    if value is None:
        return
    if not isinstance(value, str):
        report.error(f"{where}: {CHAT_TEMPLATE_KEY}: must be a path to a Jinja file")
        return
    try:
        ChatTemplate.load(resolve(value, version, repo.env))
    except (OSError, ValueError) as exc:
        report.error(f"{where}: {CHAT_TEMPLATE_KEY}: {exc}")


def _check_model_path(
    repo: Repository,
    version: Path,
    where: str,
    settings: Mapping[str, Any],
    spec: EngineSpec,
    report: ModelReport,
) -> None:
    value = settings.get(spec.model_key)
    if not isinstance(value, str) or not value:
        report.error(f"{where}: {spec.model_key!r} (the model to serve) is missing")
        return
    report.model = value
    try:
        path = resolve(value, version, repo.env)
    except ValueError as exc:
        report.error(f"{where}: {spec.model_key}: {exc}")
        return
    shown = value if str(path) == value else f"{value} ({path})"
    if spec.model_kind == "gguf":
        if not path.is_file():
            report.error(f"{where}: {spec.model_key}: GGUF file {shown} does not exist")
        elif _magic(path) != GGUF_MAGIC:
            report.error(f"{where}: {spec.model_key}: {shown} is not a GGUF file")
    elif not path.is_dir():
        report.error(f"{where}: {spec.model_key}: model directory {shown} does not exist")
    elif spec.model_kind == "tokenizer":
        if not (path / "tokenizer_config.json").is_file():
            report.error(f"{where}: {spec.model_key}: {shown} has no tokenizer_config.json")
    elif not (path / "config.json").is_file():
        report.error(
            f"{where}: {spec.model_key}: {shown} has no config.json — not a HuggingFace "
            "model directory (a GGUF file is served by the llamacpp engine)"
        )
    for key in spec.path_keys:
        other = settings.get(key)
        if key == spec.model_key or not isinstance(other, str):
            continue
        try:
            if not resolve(other, version, repo.env).exists():
                report.error(f"{where}: {key}: {other} does not exist")
        except ValueError as exc:
            report.error(f"{where}: {key}: {exc}")


def _magic(path: Path) -> bytes:
    with path.open("rb") as handle:
        return handle.read(len(GGUF_MAGIC))


def _check_engine_args(
    repo: Repository, where: str, settings: Mapping[str, Any], spec: EngineSpec, report: ModelReport
) -> None:
    known = repo.known(spec.key)
    if isinstance(known, str):
        report.note(f"engine arguments not checked: {known}")
        return
    for key in sorted(set(settings) - spec.file_keys - known.names - {CHAT_TEMPLATE_KEY}):
        close = difflib.get_close_matches(key, sorted(known.names), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        report.error(
            f"{where}: {key!r} is not a {spec.label} engine argument{hint} [{known.source}]"
        )


def _check_lora(
    repo: Repository,
    version: Path,
    settings: Mapping[str, Any],
    spec: EngineSpec,
    report: ModelReport,
) -> None:
    path = version / LORA_FILE
    if not path.is_file():
        return
    where = f"{version.name}/{LORA_FILE}"
    try:
        adapters = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        report.error(f"{where} is not valid JSON: {exc}")
        return
    if not isinstance(adapters, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in adapters.items()
    ):
        report.error(f'{where} must map adapter names to directories: {{"name": "/path"}}')
        return
    if spec.key not in LORA_ENGINES:
        report.error(f"{where}: {spec.label} models do not serve LoRA adapters")
        return
    if spec.key == "vllm" and settings.get("enable_lora") is not True:
        report.error(
            f"{where} lists adapters but {version.name}/{spec.config_file} does not set "
            '"enable_lora": true'
        )
    for name, value in adapters.items():
        if problem := name_problem(name):
            report.error(f"{where}: adapter {problem.removeprefix('model ')}")
        try:
            adapter = resolve(value, version, repo.env)
        except ValueError as exc:
            report.error(f"{where}: adapter {name!r}: {exc}")
            continue
        if not (adapter / "adapter_config.json").is_file():
            report.error(
                f"{where}: adapter {name!r}: {value} is not a PEFT adapter directory "
                "(no adapter_config.json)"
            )
        elif spec.key == "llamacpp" and not (adapter / GGUF_ADAPTER_FILE).is_file():
            report.error(
                f"{where}: adapter {name!r}: llama.cpp needs {value}/{GGUF_ADAPTER_FILE} "
                "(a GGUF LoRA)"
            )


# --- tokenizer models and ensembles ------------------------------------------------


def _check_tokenizer(repo: Repository, model_dir: Path, config: Any, report: ModelReport) -> None:
    value = pbtxt.parameters(config).get("tokenizer_file", "")
    if not value:
        report.error("config.pbtxt: parameter tokenizer_file (a tokenizer.json) is missing")
        return
    report.model = value
    try:
        path = resolve(value, model_dir, repo.env)  # the backend resolves against the model dir
    except ValueError as exc:
        report.error(f"config.pbtxt: tokenizer_file: {exc}")
        return
    if not path.is_file():
        report.error(f"config.pbtxt: tokenizer_file {value} does not exist")
    elif problem := repo.tokenizer_problem(path):
        report.error(f"config.pbtxt: tokenizer_file {value}: {problem}")


def _check_ensemble(repo: Repository, config: Any, report: ModelReport) -> None:
    steps = config.ensemble_scheduling.step
    report.model = " → ".join(s.model_name for s in steps)
    if not steps:
        report.error("config.pbtxt: an ensemble needs ensemble_scheduling { step [...] }")
        return
    available, _ = pbtxt.tensor_names(config)  # tensors the data flow can read so far
    for number, step in enumerate(steps, 1):
        label = f"step {number} ({step.model_name})"
        if step.model_name not in repo.configs:
            report.error(f"{label}: no model {step.model_name!r} in this repository")
        target = repo.configs.get(step.model_name)
        if target is not None:
            inputs, outputs = pbtxt.tensor_names(target)
            for key in step.input_map:
                if inputs and key not in inputs:
                    report.error(f"{label}: {step.model_name} has no input {key!r}")
            for key in step.output_map:
                if outputs and key not in outputs:
                    report.error(f"{label}: {step.model_name} has no output {key!r}")
        for key, tensor in step.input_map.items():
            if tensor not in available:
                report.error(
                    f"{label}: input {key!r} reads {tensor!r}, which neither the ensemble's "
                    "inputs nor an earlier step provide"
                )
        available.update(step.output_map.values())
    produced = {t for s in steps for t in s.output_map.values()}
    for output in config.output:
        if output.name not in produced:
            report.error(f"output {output.name!r} is produced by no step")
