#!/usr/bin/env bash
# Session 59, GPU call 1: session 58's call 5, which found no machine (the recorded eager calls on by default:
# SparseGatedMLP(eager_graphs=4), recordings from 4096 up to 12,288 tokens' work at 2048 x 5632), and run d's loss.
#   1. the whole `-m gpu` suite, three pytest processes (its layers now record their repeated eager calls);
#   2. scripts/eager_floor_probe.py --graphs 4 at the shipped settings, 4096-16,384 tokens in one process (the
#      recorded 12,288-token call after the smaller counts', as session 58's runs d-f);
#   3. the same probe on 12,288 then 16,384 tokens (12,288 first, as session 58's runs a-b): with 2's JSON, each
#      layer's hot-set size at 12,288 tokens (`<set>_n_hot`) in both orders.
# Predictions: bench_results/<gpu>/session59_runs.md, written before the call.
#   TWELL_COMMIT=<sha> [CALL_NO=k] bash scripts/gpu_session59_call1.sh
MARK=gpu GROUPS_N=3 TOTAL=290 TWELL_SESSION=session59 bash "$(dirname "$0")/gpu_kernel_tests.sh"
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session59 "${CALL_NO:-1}"
stage probe_smaller_first 130 "tokens=|Error|error" python3 scripts/eager_floor_probe.py --policies default \
  --graphs 4 --tokens 4096 6144 8192 12288 16384 --reps 9 --out "$R"
[ -f "$R/eager_floor_probe.json" ] && mv "$R/eager_floor_probe.json" "$R/probe_smaller_first_call${CALL}_$S.json"
stage probe_12288_first 90 "tokens=|Error|error" python3 scripts/eager_floor_probe.py --policies default \
  --graphs 4 --tokens 12288 16384 --reps 9 --out "$R"
[ -f "$R/eager_floor_probe.json" ] && mv "$R/eager_floor_probe.json" "$R/probe_12288_first_call${CALL}_$S.json"
call_end
