#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (build 11312, commit 0c1e570) from the llama.cpp tree that the
# PyPI sdist llama-cpp-python==0.3.36 vendors, and cache the binary outside the clone:
#   ${PHAROS_ENGINE_CACHE:-$HOME/.cache/pharos-engines}/llama.cpp-b11312/bin/llama-server
# Idempotent: exits at once when that binary exists and `--version` runs.
# Environment: PHAROS_ENGINE_CACHE, LLAMA_BUILD_JOBS (default: nproc),
#              LLAMA_OPT_FLAGS (default "-O1": about 2x faster to build than -O3, fast enough
#              for tiny test models).
set -euo pipefail

CACHE="${PHAROS_ENGINE_CACHE:-$HOME/.cache/pharos-engines}"
SDIST_VERSION="0.3.36"
BUILD_NUMBER="11312"
BUILD_COMMIT="0c1e570"
PREFIX="$CACHE/llama.cpp-b$BUILD_NUMBER"
BIN="$PREFIX/bin/llama-server"
WORK="$PREFIX/work"
LOG="$PREFIX/build.log"
JOBS="${LLAMA_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"
OPT="${LLAMA_OPT_FLAGS:--O1}"

if [[ -x "$BIN" ]] && "$BIN" --version >/dev/null 2>&1; then
    echo "llama-server: cached at $BIN"
    exit 0
fi

mkdir -p "$PREFIX/bin" "$WORK"
: >"$LOG"
echo "llama-server: building into $BIN (log: $LOG)"
start=$(date +%s)

log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$LOG"; }
fail() { log "FAILED: $*"; echo "--- last lines of $LOG ---" >&2; tail -n 40 "$LOG" >&2; exit 1; }

# Tools: cmake, a C++ compiler (apt-get when missing and root), ninja (below).
have_cxx() { command -v c++ >/dev/null || command -v g++ >/dev/null; }
if ! command -v cmake >/dev/null || ! have_cxx; then
    if command -v apt-get >/dev/null && [[ "$(id -u)" == 0 ]]; then
        log "apt-get install cmake g++"
        { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q cmake g++; } \
            >>"$LOG" 2>&1 || fail "apt-get install cmake g++"
    fi
fi
have_cxx || fail "no C++ compiler (apt-get install g++)"
# A small build venv: scikit-build-core (wheel) so that `pip download` can read the sdist's
# metadata without build isolation (with isolation, --no-binary :all: builds every build
# dependency from source, recursively: minutes on a machine without a pip cache), and ninja from
# pip when the machine has none.
BVENV="$PREFIX/build-venv"
if [[ ! -f "$BVENV/.ready" ]]; then
    log "build venv $BVENV (scikit-build-core, ninja if missing)"
    python3 -m venv "$BVENV" >>"$LOG" 2>&1 || fail "python3 -m venv"
    extra=""
    command -v ninja >/dev/null || extra="ninja"
    command -v cmake >/dev/null || extra="$extra cmake"
    "$BVENV/bin/python" -m pip install -q --no-input --progress-bar off \
        "scikit-build-core>=0.9.2" $extra >>"$LOG" 2>&1 || fail "pip install scikit-build-core $extra"
    touch "$BVENV/.ready"
fi
if ! command -v ninja >/dev/null; then
    [[ -x "$BVENV/bin/ninja" ]] || "$BVENV/bin/python" -m pip install -q ninja >>"$LOG" 2>&1 || true
    if [[ -x "$BVENV/bin/ninja" ]]; then
        export PATH="$BVENV/bin:$PATH"
    elif command -v apt-get >/dev/null && [[ "$(id -u)" == 0 ]]; then
        log "apt-get install ninja-build"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q ninja-build >>"$LOG" 2>&1 \
            || { apt-get update -q >>"$LOG" 2>&1 && DEBIAN_FRONTEND=noninteractive \
                 apt-get install -y -q ninja-build >>"$LOG" 2>&1; } || true
    fi
fi
[[ -x "$BVENV/bin/cmake" ]] && ! command -v cmake >/dev/null && export PATH="$BVENV/bin:$PATH"
command -v cmake >/dev/null || fail "cmake not found (apt-get install cmake)"
command -v ninja >/dev/null || fail "ninja not found"

# Source: the sdist, downloaded once.
SDIST_DIR="$WORK/sdist"
SRC="$WORK/src/llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp"
if [[ ! -f "$SRC/tools/server/server.cpp" ]]; then
    mkdir -p "$SDIST_DIR" "$WORK/src"
    if ! ls "$SDIST_DIR"/llama_cpp_python-"$SDIST_VERSION".tar.gz >/dev/null 2>&1; then
        log "pip download llama-cpp-python==$SDIST_VERSION (sdist)"
        "$BVENV/bin/python" -m pip download --no-deps --no-binary :all: --no-build-isolation \
            -d "$SDIST_DIR" "llama-cpp-python==$SDIST_VERSION" >>"$LOG" 2>&1 || fail "pip download"
    fi
    log "extracting vendor/llama.cpp"
    rm -rf "$WORK/src"; mkdir -p "$WORK/src"
    tar -xzf "$SDIST_DIR"/llama_cpp_python-"$SDIST_VERSION".tar.gz -C "$WORK/src" \
        "llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp" >>"$LOG" 2>&1 || fail "tar"
    [[ -f "$SRC/tools/server/server.cpp" ]] || fail "no tools/server in the sdist"
fi

BUILD="$WORK/build"
log "cmake configure (opt: $OPT, jobs: $JOBS)"
cmake -S "$SRC" -B "$BUILD" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    "-DCMAKE_C_FLAGS_RELEASE=$OPT -DNDEBUG" "-DCMAKE_CXX_FLAGS_RELEASE=$OPT -DNDEBUG" \
    -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_CCACHE=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_NUMBER="$BUILD_NUMBER" -DLLAMA_BUILD_COMMIT="$BUILD_COMMIT" \
    >>"$LOG" 2>&1 || fail "cmake configure"
log "cmake build --target llama-server"
cmake --build "$BUILD" --target llama-server -j "$JOBS" >>"$LOG" 2>&1 || fail "cmake build"

cp "$BUILD/bin/llama-server" "$BIN.tmp"
strip "$BIN.tmp" 2>/dev/null || true
mv "$BIN.tmp" "$BIN"
"$BIN" --version >>"$LOG" 2>&1 || fail "built binary does not run"
# Keep the sdist (small) for a rebuild; drop the build tree (hundreds of MB of objects).
rm -rf "$BUILD" "$WORK/src"
log "done in $(( $(date +%s) - start )) s: $BIN"
