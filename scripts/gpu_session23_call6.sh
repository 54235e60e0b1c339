#!/usr/bin/env bash
# Session 23, GPU call 6: the 1.5B forward with the one-GEMM q/k/v projections on top of call 5's bound (both
# variants alike), then the whole GPU test suite.  OUT, TWELL_COMMIT from the caller; files packed into
# $OUT/results_call6_session23.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src PYTHONUNBUFFERED=1
S=session23
R="$OUT/run"
mkdir -p "$R"
timeout 75 python3 -m twell.cli bench model --preset 1.5b --parts forward --fused-norms --fused-rope --fused-qkv \
  --isolation none --out "$R" --stem model_forward_bound13_qkv_$S > "$R/model_forward_bound13_qkv_$S.log" 2>&1
echo "forward qkv rc=$?"; rm -rf "$R"/*_parts; tail -4 "$R/model_forward_bound13_qkv_$S.log"
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests > "$R/pytest_gpu_all_$S.log" 2>&1
echo "pytest rc=$?"; tail -3 "$R/pytest_gpu_all_$S.log"
tar czf "$OUT/results_call6_$S.tgz" -C "$OUT" run && rm -rf "$R"
