#!/usr/bin/env bash
# Session 54, GPU call 2: the recorded 1.5B forward at 2048 tokens (cached weights, tables policy), the dense-row pass
# as three cuBLAS GEMMs (BATCH_PASS_MAX_ROWS 0, as shipped before this session) and through the small-batch kernels
# (64), each in its own process.  Predictions: bench_results/<gpu>/session54_runs.md, written before the call.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session54 2
nvidia-smi --query-gpu=name --format=csv,noheader
budget=0
for n in 0 64; do
  budget=$((budget + 140))
  stage "probe_batch${n}_2048" "$(left "$budget")" "^tokens=.*(gpu)|passes|budget|Error" \
    python3 scripts/recorded_forward_probe.py --policy tables --top 40 --samples 5 --cached-weights --tokens 2048 \
    --batch-pass-rows "$n" --out "$R/batch${n}_2048"
done
call_end
