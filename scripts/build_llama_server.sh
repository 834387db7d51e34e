#!/usr/bin/env bash
# llama.cpp's `llama-server` for the llamacpp real_engine tests, built once per machine.
#
# PyPI ships no llama.cpp binary, but the `llama-cpp-python` sdist vendors the whole llama.cpp
# tree (vendor/llama.cpp, with tools/server). We download that sdist with pip, build only the
# `llama-server` target (Release, CPU only: no CUDA, no BLAS, no web UI, no OpenSSL), keep the one
# binary in the cache folder outside the checkout and link it as .build/llama-server:
#
#   $BATCHLAB_CACHE_DIR/llama.cpp/llama-cpp-python-<version>/llama-server   (about 15 MB)
#   .build/llama-server -> that binary
#
# A cold build takes about 8-11 minutes on 2 cores; afterwards this script only compares a stamp
# (sdist version + CMake options + compiler + CPU flags, since GGML_NATIVE tunes the binary to this
# CPU) and returns in well under a second. Usage: bash scripts/build_llama_server.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
VERSION=${LLAMA_CPP_PY_VERSION:-0.3.36}
JOBS=${BATCHLAB_BUILD_JOBS:-2}
CACHE_DIR=${BATCHLAB_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/batchlab}
DEST=$CACHE_DIR/llama.cpp/llama-cpp-python-$VERSION
LINK=.build/llama-server
CMAKE_OPTS=(
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON
  -DGGML_CUDA=OFF -DGGML_BLAS=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
  # no web UI: the prebuilt one would be fetched from a model hub, which is unreachable here
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF
)
export PIP_DISABLE_PIP_VERSION_CHECK=1

mkdir -p "$DEST" .build
exec 8>"$CACHE_DIR/.llama-server-build.lock"  # two CI jobs sharing the cache would race
flock 8

cpu_flags=$(grep -m1 '^flags' /proc/cpuinfo | sha256sum | cut -c1-12)
stamp="llama-cpp-python==$VERSION cmake=${CMAKE_OPTS[*]} cxx=$(c++ --version | head -n1) cpu=$cpu_flags"

if [[ -x $DEST/llama-server && -f $DEST/.batchlab-stamp && "$(cat "$DEST/.batchlab-stamp")" == "$stamp" ]]; then
  echo "build_llama_server: $DEST/llama-server is up to date (llama-cpp-python $VERSION)"
else
  start=$(date +%s)
  echo "build_llama_server: building llama-server from the llama-cpp-python $VERSION sdist" \
       "(-j$JOBS, about 8-11 minutes on 2 cores)"
  sdist=$DEST/llama_cpp_python-$VERSION.tar.gz
  if [[ ! -f $sdist ]]; then
    # --no-binary for this one package only: build-time tools (scikit-build-core) come as wheels
    $PY -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$DEST"
  fi
  work=$DEST/work
  rm -rf "$work" "$DEST/llama-server" "$DEST/.batchlab-stamp"
  mkdir -p "$work"
  tar -xzf "$sdist" -C "$work"
  src=$work/llama_cpp_python-$VERSION/vendor/llama.cpp
  log=$DEST/build.log
  if ! { cmake -S "$src" -B "$work/build" "${CMAKE_OPTS[@]}" \
         && cmake --build "$work/build" --target llama-server -j"$JOBS"; } > "$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "build_llama_server: error: the build failed (full log: $log)" >&2
    exit 1
  fi
  cp "$work/build/bin/llama-server" "$DEST/llama-server"
  # The server's own usage text, kept for the adapter's flag checks without the source tree.
  "$DEST/llama-server" --help > "$DEST/llama-server-help.txt" 2>&1 || true
  rm -rf "$work"  # about 200 MB of objects; the binary is all the tests need
  echo "$stamp" > "$DEST/.batchlab-stamp"
  echo "build_llama_server: llama-server ready in $(( $(date +%s) - start )) s"
fi
ln -sfn "$DEST/llama-server" "$LINK"
"$LINK" --version 2>&1 | grep -m1 -i 'version' || true
