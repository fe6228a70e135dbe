#!/usr/bin/env bash
# Create .venv-bench: the benchmark tools' own venv (genai-perf, aiperf, perf_analyzer).
#
# Why a separate venv: genai-perf and aiperf pin their own transformers/pandas, which
# must not disturb the serving venv (.venv) that vLLM and the Triton stub import.
# Idempotent: a stamp records the lock's hash; a matching stamp means nothing to do.
#   scripts/setup_bench_venv.sh            install from requirements/bench.txt (the lock)
#   scripts/setup_bench_venv.sh --relock   resolve the top-level pins again, rewrite the lock
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TRITONFORGE_BENCH_VENV:-$ROOT/.venv-bench}"
LOCK="$ROOT/requirements/bench.txt"
PYTHON="${PYTHON:-python3.11}"
SERVING_VENV="${TRITONFORGE_VENV:-$ROOT/.venv}"
# Downloads are cached inside the clone, as bootstrap.sh does.
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$ROOT/.cache/pip}"
# The top-level pins; everything else comes from the lock. tritonclient stays at the
# server's 2.51 here, apart from .venv (Triton 2.51 workaround W8, see
# docs/triton-2.51-workarounds.md).
TOP_LEVEL=(genai-perf==0.0.16 aiperf==0.13.0 "tritonclient[all]==2.51.0")

relock=0
[[ "${1:-}" == "--relock" ]] && relock=1

log() { printf 'setup_bench_venv: %s\n' "$*" >&2; }
# pip, with the machine's notes about absent local mirrors filtered out of its stderr.
pip_quiet() {
  "$VENV/bin/python" -m pip "$@" --quiet --disable-pip-version-check 2> >(grep -v 'is ignored: it is neither' >&2)
}

# perf_analyzer (tritonclient 2.51) links libb64.so.0d from Debian.
if ! ldconfig -p | grep -q 'libb64.so.0d'; then
  log "installing Debian libb64-0d (perf_analyzer needs libb64.so.0d)"
  if [[ $(id -u) -eq 0 ]]; then
    apt-get install -y --no-install-recommends libb64-0d >/dev/null 2>&1 \
      || { apt-get update >/dev/null && apt-get install -y --no-install-recommends libb64-0d >/dev/null; }
  else
    sudo apt-get install -y --no-install-recommends libb64-0d >/dev/null
  fi
fi

stamp="$VENV/.tritonforge-lock-sha256"
want=""
[[ -f "$LOCK" ]] && want="$(sha256sum "$LOCK" | cut -d' ' -f1)"
if [[ $relock -eq 0 && -n "$want" && -f "$stamp" && "$(cat "$stamp")" == "$want" \
      && -x "$VENV/bin/genai-perf" && -x "$VENV/bin/aiperf" ]]; then
  log "up to date: $VENV"
else
  [[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
  pip_quiet install pip==24.3.1
  if [[ $relock -eq 1 || ! -f "$LOCK" ]]; then
    log "resolving ${TOP_LEVEL[*]}"
    pip_quiet install "${TOP_LEVEL[@]}"
    {
      echo "# Lock for .venv-bench (made by scripts/setup_bench_venv.sh --relock); do not edit by hand."
      echo "# Top level: ${TOP_LEVEL[*]}"
      "$VENV/bin/python" -m pip freeze --disable-pip-version-check | grep -v '^pip=='
    } >"$LOCK"
  else
    log "installing the lock $LOCK"
    pip_quiet install -r "$LOCK"
  fi
  sha256sum "$LOCK" | cut -d' ' -f1 >"$stamp"
fi

# perf_analyzer also needs libcudart.so.12 (it never touches a GPU here). The serving
# venv's Triton wheel ships one under an auditwheel name: link it under the soname and
# put a wrapper on PATH that finds it, so `perf_analyzer` (and genai-perf, which runs it)
# works without any environment set up by the caller.
libs="$VENV/lib/tritonforge-libs"
mkdir -p "$libs" "$VENV/libexec"
cudart="$(ls "$SERVING_VENV"/lib/python3.11/site-packages/nvidia_pytriton.libs/libcudart-*.so.12* 2>/dev/null | head -1 || true)"
if [[ -z "$cudart" ]]; then
  log "error: no libcudart in $SERVING_VENV (nvidia-pytriton); create the serving venv first"
  exit 1
fi
ln -sfn "$cudart" "$libs/libcudart.so.12"
if file -b "$VENV/bin/perf_analyzer" 2>/dev/null | grep -q ELF \
   || head -c 4 "$VENV/bin/perf_analyzer" | grep -q 'ELF'; then
  mv -f "$VENV/bin/perf_analyzer" "$VENV/libexec/perf_analyzer"
fi
cat >"$VENV/bin/perf_analyzer" <<WRAP
#!/usr/bin/env bash
# Wrapper made by scripts/setup_bench_venv.sh: the real binary needs libcudart.so.12.
export LD_LIBRARY_PATH="$libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$VENV/libexec/perf_analyzer" "\$@"
WRAP
chmod +x "$VENV/bin/perf_analyzer"

"$VENV/bin/perf_analyzer" --version >/dev/null 2>&1 || "$VENV/bin/perf_analyzer" --help >/dev/null 2>&1 \
  || { log "error: perf_analyzer does not run"; "$VENV/bin/perf_analyzer" --version; exit 1; }
log "ready: $VENV (genai-perf, aiperf, perf_analyzer)"
