#!/usr/bin/env bash
# Session 58, GPU call 5: the recorded eager calls on by default (SparseGatedMLP(eager_graphs=4), recordings from 4096
# up to 12,288 tokens' work at 2048 x 5632, call_graphs.RECORD_MIN_FLOPS / RECORD_MAX_FLOPS).
#   1. the whole `-m gpu` suite, three pytest processes (its layers now record their repeated eager calls);
#   2. scripts/eager_floor_probe.py --graphs 4 at the shipped settings, 4096-16,384 tokens;
#   3. twell bench model --parts forward --batch 6 (12,288 tokens) with its default forward policies.
# Predictions: bench_results/<gpu>/session58_runs.md, written before the call.
#   TWELL_COMMIT=<sha> [CALL_NO=k] bash scripts/gpu_session58_call5.sh
MARK=gpu GROUPS_N=3 TOTAL=290 TWELL_SESSION=session58_call5 bash "$(dirname "$0")/gpu_kernel_tests.sh"
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session58 "${CALL_NO:-5}"
stage probe_default_on_g 100 "tokens=|Error|error" python3 scripts/eager_floor_probe.py --policies default \
  --graphs 4 --tokens 4096 6144 8192 12288 16384 --reps 9 --out "$R"
[ -f "$R/eager_floor_probe.json" ] && mv "$R/eager_floor_probe.json" "$R/probe_default_on_g_call${CALL}_$S.json"
stage model_forward_b6 130 "^\| forward|^total|Error" python3 -m twell.cli bench model --preset 1.5b \
  --parts forward --batch 6 --fused-norms --fused-residual --energy-seconds 0 --out "$R" \
  --stem "model_forward_b6_call${CALL}_${S}"
forward_summary "$R/model_forward_b6_call${CALL}_${S}.json"
call_end
