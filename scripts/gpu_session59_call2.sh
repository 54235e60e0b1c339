#!/usr/bin/env bash
# Session 59, GPU call 2: `twell bench model --parts forward --batch 6` (12,288 tokens) with its default forward
# policies (default, default+graphs, always-sparse): the 28 layers' recordings at the top of the window.
# Predictions: bench_results/<gpu>/session59_runs.md, written before the call.
#   TWELL_COMMIT=<sha> [CALL_NO=k] bash scripts/gpu_session59_call2.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session59 "${CALL_NO:-2}"
stage model_forward_b6 240 "^\| forward|^total|Error" python3 -m twell.cli bench model --preset 1.5b \
  --parts forward --batch 6 --fused-norms --fused-residual --energy-seconds 0 --out "$R" \
  --stem "model_forward_b6_call${CALL}_${S}"
forward_summary "$R/model_forward_b6_call${CALL}_${S}.json"
call_end
