#!/usr/bin/env bash
# One call on the GPU machine: correctness (the whole test suite, GPU tests included), then the
# benchmark sweep.  Usage: scripts/gpu_check_and_bench.sh [extra args for `twell bench ffn`]
# Writes logs, JSON, CSV and the plot under $OUT (default ./out).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
if [ "${SKIP_TESTS:-0}" != "1" ]; then
  timeout "${TEST_TIMEOUT:-240}" python3 -m pytest tests -q -x -p no:cacheprovider ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/pytest.log" | tail -n 25
fi
if [ "${SKIP_BENCH:-0}" != "1" ]; then
  python3 -m twell.cli bench ffn --out "$OUT" --stem "${STEM:-ffn}" "$@" 2>&1 | tee "$OUT/bench.log"
fi
