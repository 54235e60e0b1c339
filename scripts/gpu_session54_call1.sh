#!/usr/bin/env bash
# Session 54, GPU call 1: the dense-row pass through the small-batch kernels (hot_cold_dense_rows.BATCH_PASS_MAX_ROWS).
# A pass of 64 rows (the smallest budget, a 2048-token call's) read Wg, Wu and Wd whole in three cuBLAS GEMMs for a few
# long rows and row 0 again; the small-batch kernels (twell.ops.decode_batch_kernels) read Wu and Wd^T only at the
# units that fire in some of those rows.  Predictions: bench_results/<gpu>/session54_runs.md, written before the call.
#   1. the two dense-row test files natively (the new batch-pass tests among them);
#   2. the steep-head layer's kernels at 2048 tokens / l0 28, the pass as three GEMMs (0) and through the kernels (64);
#   3. tune-dispatch, held sparse, steep head (40 / 4) and default head (4 / 32), 2048 and 4096 tokens, 0.25-1 %,
#      at 0 and 64.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session54 1
nvidia-smi --query-gpu=name --format=csv,noheader
stage pytest_dense_rows "$(left 130)" "passed|failed|Error" python3 -m pytest -q -p no:cacheprovider -x \
  tests/test_ops_dense_rows_kernels.py tests/test_ops_hot_cold_dense_rows.py
for n in 0 64; do
  stage "profile_head40_batch$n" "$(left $((130 + 45 * (n / 64 + 1))))" "^M=|^ +0\.[0-9]{3} +[0-9]+ +_" \
    python3 scripts/infer_op_profile.py --policy sparse --early-boost 40 --early-decay 4 --batch-pass-rows "$n" \
    --points 2048:28
done
budget=220
for args in "head40_batch0 40 4 0" "head40_batch64 40 4 64" "head4_batch0 4 32 0" "head4_batch64 4 32 64"; do
  read -r label boost decay n <<< "$args"
  budget=$((budget + 80))
  stage "tune_$label" "$(left "$budget")" "x  err|ERROR|Error" python3 scripts/twell_patched.py \
    --set "twell.ops.hot_cold_dense_rows.BATCH_PASS_MAX_ROWS=$n" \
    -- tune-dispatch --shape 2048x5632 --ms 2048 4096 --densities 0.25 0.5 1 --early-boost "$boost" \
    --early-decay "$decay" --out "$R" --stem "dispatch_2048x5632_${S}_$label"
done
call_end
