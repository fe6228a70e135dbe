#!/usr/bin/env bash
# Build the C++ tokenizer: the Triton backend (build/backends/tokenizer/libtriton_tokenizer.so,
# picked up by tritonforge.launch.launcher) and the pybind11 module `tritonforge_tokenizer` (into
# .venv). Idempotent and fast when nothing changed: CMake rebuilds incrementally and the
# pip install is skipped while the installed module was built from the same sources.
#
#   scripts/build_tokenizer.sh            # build what is stale
#   TRITONFORGE_FORCE=1 scripts/build_tokenizer.sh   # rebuild and reinstall anyway
#
# Needs: cmake >= 3.25, g++ (C++17), Debian nlohmann-json3-dev (installed here with
# apt-get when missing and we are root), the pins in requirements/tokenizer.txt.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/backends/tokenizer"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
BUILD="$ROOT/build/tokenizer"
JOBS="${TRITONFORGE_JOBS:-2}"

log() { printf 'build_tokenizer: %s\n' "$*" >&2; }

if [ ! -f /usr/include/nlohmann/json.hpp ]; then
  if [ "$(id -u)" = 0 ]; then
    log "installing nlohmann-json3-dev"
    apt-get install -y --no-install-recommends nlohmann-json3-dev >/dev/null \
      || { apt-get update >/dev/null && apt-get install -y --no-install-recommends nlohmann-json3-dev >/dev/null; }
  else
    log "missing /usr/include/nlohmann/json.hpp: sudo apt-get install nlohmann-json3-dev"
    exit 1
  fi
fi

# Build requirements of the pybind11 module (pinned; no-op when present).
if ! "$PYTHON" -c 'import pybind11, scikit_build_core' 2>/dev/null; then
  "$PYTHON" -m pip install --quiet -r "$ROOT/requirements/tokenizer.txt"
fi

# 1. Triton backend.
cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
  -DTRITONFORGE_BUILD_TRITON=ON -DTRITONFORGE_BUILD_PYTHON=OFF >/dev/null
cmake --build "$BUILD" --target triton_tokenizer -j "$JOBS" >/dev/null
mkdir -p "$ROOT/build/backends/tokenizer"
install -m 0755 "$BUILD/libtriton_tokenizer.so" "$ROOT/build/backends/tokenizer/libtriton_tokenizer.so.tmp"
mv -f "$ROOT/build/backends/tokenizer/libtriton_tokenizer.so.tmp" \
  "$ROOT/build/backends/tokenizer/libtriton_tokenizer.so"
log "backend: build/backends/tokenizer/libtriton_tokenizer.so"

# 2. pybind11 module, reinstalled only when its sources changed.
digest="$(cd "$SRC" && find core python CMakeLists.txt pyproject.toml -type f \
  \( -name '*.cpp' -o -name '*.h' -o -name '*.py' -o -name '*.pyi' -o -name '*.txt' -o -name '*.toml' \) \
  -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-64)"
stamp="$ROOT/build/tokenizer-python.sha256"
if [ "${TRITONFORGE_FORCE:-0}" != 1 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ] \
  && "$PYTHON" -c 'import tritonforge_tokenizer' 2>/dev/null; then
  log "python module: up to date"
else
  CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" "$PYTHON" -m pip install --quiet --no-build-isolation \
    --no-deps --force-reinstall "$SRC"
  echo "$digest" >"$stamp"
  log "python module: installed tritonforge_tokenizer into $("$PYTHON" -c 'import sys; print(sys.prefix)')"
fi
