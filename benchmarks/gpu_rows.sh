#!/usr/bin/env bash
# Issue 15's GPU rows: the speed benchmarks on a CUDA GPU in one command, for a session lent a GPU machine
# (.library/device: 15 minutes of device time, 10 per command; that machine has PyTorch and transformers but not
# this project's other needs, and no network).
#
#   bash benchmarks/gpu_rows.sh prepare    # here, with network: wheels and Multi30k's training text into .gpu/
#   bash benchmarks/gpu_rows.sh run        # there, as the device tool's command, carry [".gpu"]
#
# `run` installs the wheels into /tmp/site, prints the versions it runs with, then runs each benchmark with --device
# cuda under its own time limit, so that one slow table cannot take the others' time: 9 minutes at most (give the
# device tool `timeout_s` 600). Each table goes to $OUT/<benchmark>.txt as it is printed ($OUT: the device tool's
# folder that comes back; runs/gpu_rows here). `DEVICE=cpu NO_INSTALL=1` tries the same commands here, on the CPU,
# with this Python's packages.
set -uo pipefail
cd "$(dirname "$0")/.."
HERE=.gpu
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-runs/gpu_rows}

prepare() {
    set -e
    grep -qxF "/$HERE/" .git/info/exclude 2>/dev/null || echo "/$HERE/" >> .git/info/exclude
    mkdir -p "$HERE/wheels" "$HERE/data/multi30k"
    cp ../shared/data/multi30k/train.en ../shared/data/multi30k/train.de "$HERE/data/multi30k/"
    # The machine's Python is 3.12; what it lacks, or has too old for pyproject.toml (transformers there: 5.17).
    local packages=(
        "transformers==$(python -c 'import transformers; print(transformers.__version__)')"
        "datasets==$(python -c 'import datasets; print(datasets.__version__)')"
        evaluate sacremoses "dill<0.4.2" "multiprocess<0.70.20" "regex>=2025.10.22" "fsspec<=2026.9.0"
    )
    python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$HERE/wheels" "${packages[@]}"
    du -sh "$HERE"
}

step() {  # step NAME SECONDS COMMAND...: one benchmark, its output to $OUT/NAME.txt
    local name=$1 seconds=$2
    shift 2
    echo "== $name ($seconds s at most): $*"
    timeout "$seconds" "$@" 2>&1 | tee "$OUT/$name.txt"
    echo "== $name: exit ${PIPESTATUS[0]}"
}

run() {
    mkdir -p "$OUT"
    [ -n "${NO_INSTALL:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site "$HERE"/wheels/*.whl || exit 1
    export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
    python3 -c 'import torch, transformers, datasets, accelerate; print(torch.__version__, torch.version.cuda,
        torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU", "transformers",
        transformers.__version__, "datasets", datasets.__version__, "accelerate", accelerate.__version__)'
    python3 -c 'import pyarrow, tokenizers, huggingface_hub; print("pyarrow", pyarrow.__version__, "tokenizers",
        tokenizers.__version__, "huggingface_hub", huggingface_hub.__version__)'  # each step fails alone, if at all
    local data=(--data "$HERE/data/multi30k" --cache-dir "$HERE/cache")
    # (1a) identical token batches and (1b) the standard recipe, base model, fp32 and bf16, with MFU and memory
    # (~60 s on an H200; with --profile it ran past 130 s); then 4x the tokens per batch, where a GPU is less bound
    # by launching kernels
    step training_token_batches 100 python3 benchmarks/training_token_batches.py --device "$DEVICE" \
        --preset base --max-tokens 4096 --steps 12 --warmup 3 --rounds 1 "${data[@]}"
    step training_token_batches_16k 80 python3 benchmarks/training_token_batches.py --device "$DEVICE" \
        --preset base --max-tokens 16384 --steps 12 --warmup 3 --rounds 1 "${data[@]}"
    # the fixed-batch step of both models with each attention kernel
    step training_step_speed 50 python3 benchmarks/training_step_speed.py --device "$DEVICE" --batch 128 --length 32
    # decoding at a fixed length and at natural lengths, batch 1, 16 and 64, WMT's base size (one file: the device
    # tool brings back 8)
    local beam=(python3 benchmarks/beam_search_speed.py --device "$DEVICE" --preset base --vocab-size 37000
        --new-tokens 24 --repeats 3)
    step beam_search 120 bash -c "for b in 1 16 64; do ${beam[*]} --batch-size \$b; done"
    # decoding with a static cache and the step compiled (transformers' CompileConfig: CUDA graphs on a GPU), where
    # launching kernels is what a GPU's decoding step waits on (the scaling plot of 2026-11-26 made way for it)
    step beam_search_compiled 90 ${beam[*]} --batch-size 16 --compiled
    # decoding in bf16, with cuDNN's attention (PyTorch's pick) and without (it plans every new key length)
    step beam_search_bf16 100 bash -c "for a in off default; do ${beam[*]} --batch-size 16 --dtype bfloat16 \
        --cudnn-attention \$a; done"
    # Not CTranslate2: its CUDA wheel needs CUDA 12's cuBLAS, which is not on the machine and too large to carry.
}

case "${1:-}" in
    prepare) prepare ;;
    run) run ;;
    *) echo "usage: bash benchmarks/gpu_rows.sh prepare|run" >&2; exit 2 ;;
esac
