#!/usr/bin/env bash
# Session 53, GPU call 2: the long-row rule's pair bound (twell.nn.hot_cold_cache.DENSE_ROWS_SEVERE_PAIRS).  Call 1
# (bench_results/h100/session53_runs.md) found the steep sequence head's 2048-token / 0.5 % call without a dense-row
# budget (2 rows with one overflowing tile each, 5 over 64 cold pairs, none with two tiles: the several-tiles rule not
# met) and the row kernel at 0.184 ms against 0.035 with the default head.  Counting rows over N cold pairs as long
# rows gives such a call a pass.  Predictions: bench_results/<gpu>/session53_runs.md, written before the call.
#   1. the GPU sample's longest rows and the module's kernels with the bound at 256 (steep head, 2048 tokens);
#   2. tune-dispatch with the steep head (40 / 4), 2048-8192 tokens, 0.25-1 %, held sparse, at N = 0 / 256 / 128;
#   3. the default head (4 / 32) at N = 0 and 256 (no row over 256 cold pairs expected: the same budgets).
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session53 2
nvidia-smi --query-gpu=name --format=csv,noheader
stage profile_head40_pairs256 "$(left 80)" "^M=|^ +0\.[0-9]{3} +[0-9] +_" python3 scripts/infer_op_profile.py \
  --policy sparse --early-boost 40 --early-decay 4 --severe-pairs 256 --points 2048:14 2048:28
budget=80
for args in "head40_pairs0 40 4 0" "head40_pairs256 40 4 256" "head40_pairs128 40 4 128" \
            "head4_pairs0 4 32 0" "head4_pairs256 4 32 256"; do
  read -r label boost decay n <<< "$args"
  budget=$((budget + 60))
  stage "tune_$label" "$(left "$budget")" "x  err|ERROR|Error" python3 scripts/twell_patched.py \
    --set "twell.nn.hot_cold_cache.DENSE_ROWS_SEVERE_PAIRS=$n" \
    -- tune-dispatch --shape 2048x5632 --ms 2048 4096 8192 --densities 0.25 0.5 1 --early-boost "$boost" \
    --early-decay "$decay" --out "$R" --stem "dispatch_2048x5632_${S}_$label"
done
call_end
