#!/usr/bin/env bash
# Session 54, GPU call 2: the recorded 1.5B forward at 2048 tokens (cached weights, tables policy), each variant in its
# own process: as before this session (the dense-row pass as three cuBLAS GEMMs, the traced causal mask materialised),
# the pass through the small-batch kernels (hot_cold_dense_rows.BATCH_PASS_MAX_ROWS 64), and SDPA's is_causal in the
# traced forward (twell.models.causal_mask).  Predictions: bench_results/<gpu>/session54_runs.md, written before it.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session54 2
nvidia-smi --query-gpu=name --format=csv,noheader
budget=0
for args in "base 0 --no-causal-skip" "batch64 64 --no-causal-skip" "causalskip 0 --causal-skip"; do
  read -r label n skip <<< "$args"
  budget=$((budget + 150))
  stage "probe_${label}_2048" "$(left "$budget")" "^tokens=.*(gpu|sdpa|attention)|passes|budget|Error" \
    python3 scripts/recorded_forward_probe.py --policy tables --top 40 --samples 5 --cached-weights --tokens 2048 \
    --batch-pass-rows "$n" "$skip" --out "$R/${label}_2048"
done
call_end
