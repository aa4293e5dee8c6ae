#!/usr/bin/env bash
# The GPU checks of issue 13, prepared for a lent GPU machine (no network, nothing installed):
#   1. tests/triton/test_cuda.py: the Triton backend on CUDA tensors, CUDA Graphs, the lean launcher,
#      offline registers against the driver's (about 2 minutes, capped at 140 s);
#   2. vfuse bench --device cuda: JSON with copy bandwidth, every workload for eager / Inductor /
#      vfuse / vfuse + CUDA Graphs, % of copy bandwidth, replay vs launch overhead (budget 200 s, capped at 260 s).
#   3. benchmarks/device_profile.py: per-kernel device times of the slow workloads (VFUSE_PROFILE),
#      vfuse's beside Inductor's, with the cost model's prediction per kernel, and for conv_bn_relu
#      the NHWC Triton template itself (library verdict off) beside cuDNN: the conv share of
#      fusion/library.py (capped at 90 s).
#   4. benchmarks/autotune_compile.py --workers 16: the GPT-2 block's autotune candidates compiled
#      offline in a 16-thread pool (the host's cores; no GPU used), against 107 s one after another
#      (capped at 45 s; writes autotune_compile.txt).
# At most 535 s of steps in all: the device tool allows 600 s per command and ~15 minutes per session,
# machine start included, so one run fits with time to spare. Writes env.txt, gpu_tests.txt, bench.txt, bench.json and profile.txt under $OUT
# (default /tmp/vfuse-device). Runs the repository's sources (PYTHONPATH=src) under the machine's
# python3 (its torch and triton), or under VFUSE_PY. Exit status: the tests' (the bench's JSON
# says per contender what failed).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/vfuse-device}
mkdir -p "$OUT"
PY=${VFUSE_PY:-python3}
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export VFUSE_CACHE_DIR=${VFUSE_CACHE_DIR:-/tmp/vfuse-cache}
{
    nvidia-smi
    "$PY" -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, torch.cuda.get_device_name())'
} >"$OUT/env.txt" 2>&1
echo "== GPU tests" && tail -n 1 "$OUT/env.txt"
timeout 140 "$PY" -m pytest -p no:cacheprovider -q -rfE --tb=short --timeout=60 --durations=8 tests/triton/test_cuda.py 2>&1 | tee "$OUT/gpu_tests.txt" | tail -n 40
tests=$?
echo "== vfuse bench --device cuda"
timeout 260 "$PY" -m vfuse.bench --device cuda --budget-s 200 --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt" | tail -n 30
echo "== per-kernel profile (${VFUSE_PROFILE:-gpt2_block conv_bn_relu})"
timeout 90 "$PY" benchmarks/device_profile.py ${VFUSE_PROFILE:-gpt2_block conv_bn_relu} 2>&1 | tee "$OUT/profile.txt" | tail -n 60
echo "== autotune candidates compiled ahead (16 threads)"
timeout 45 "$PY" benchmarks/autotune_compile.py --workers 16 2>&1 | tee "$OUT/autotune_compile.txt" | tail -n 3
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >>"$OUT/env.txt" 2>&1
exit "$tests"
