#!/usr/bin/env bash
# Session 24, GPU call 3: the whole GPU test suite at call 2's code, then the 1.5B training step with the residual
# fusions (every variant alike; under autograd the adds stay autograd's, so the step should not move).  OUT,
# TWELL_COMMIT from the caller; files packed into $OUT/results_call3_session24.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src PYTHONUNBUFFERED=1
S=session24
R="$OUT/run"
mkdir -p "$R"
timeout 380 python3 -m pytest -q -m gpu -p no:cacheprovider tests > "$R/pytest_gpu_all_$S.log" 2>&1
echo "pytest rc=$?"; tail -3 "$R/pytest_gpu_all_$S.log"
timeout 100 python3 -m twell.cli bench model --preset 1.5b --parts train --fused-norms --fused-rope --fused-residual \
  --isolation none --out "$R" --stem model_train_residual_$S > "$R/model_train_residual_$S.log" 2>&1
echo "train rc=$?"; rm -rf "$R"/*_parts; tail -4 "$R/model_train_residual_$S.log" | head -3
tar czf "$OUT/results_call3_$S.tgz" -C "$OUT" run && rm -rf "$R"
