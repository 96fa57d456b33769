#!/usr/bin/env bash
# The CUDA checks, for a machine with an NVIDIA GPU, torch built with CUDA and nvcc (FlashInfer
# JIT-builds its kernels there): FlashInfer against the torch backend, the engine against
# transformers on the GPU, then the demo on the GPU. Run from the repository root:
#   tools/cuda_check.sh [WHEEL_DIR]    # WHEEL_DIR: wheels to install first (flashinfer)
# Logs go to $OUT (or /tmp/cuda-check). The most telling checks run first, so a run cut short
# still says the most.
set -uo pipefail
out=${OUT:-/tmp/cuda-check}
mkdir -p "$out"
if [ -n "${1:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$1"/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$(python3 -c \
    'import torch; print("%d.%d" % torch.cuda.get_device_capability())')}
export FLASHINFER_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST MAX_JOBS=${MAX_JOBS:-$(nproc)}
export RADIXSERVE_NATIVE=${RADIXSERVE_NATIVE:-0}  # the CPU kernels are not what is checked here

step() {  # step NAME COMMAND...: run, log to $out/NAME.log, report the time and status
    local name=$1 start=$SECONDS
    shift
    echo "=== $name"
    "$@" 2>&1 | tee "$out/$name.log"
    echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s"
}

nvidia-smi -L
python3 -c "import torch, flashinfer; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'flashinfer', flashinfer.__version__)"
pytest=(python3 -m pytest -p no:cacheprovider -q -rs -s)
step flashinfer-bf16 "${pytest[@]}" tests/cuda/test_flashinfer.py -k "bench-135m and bfloat16"
step engine-bf16 "${pytest[@]}" tests/cuda/test_engine_cuda.py -k "bench-135m and (bfloat16 or float32)"
step demo python3 -m radixserve.cli demo --device cuda --dtype bfloat16 --users 32 --turns 3
step rest "${pytest[@]}" tests/cuda --durations=5 -k "not (bench-135m and (bfloat16 or float32))"
