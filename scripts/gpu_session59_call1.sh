#!/usr/bin/env bash
# Session 59, GPU call 1: session 58's call 5, which found no machine (the recorded eager calls on by default:
# SparseGatedMLP(eager_graphs=4), recordings from 4096 up to 12,288 tokens' work at 2048 x 5632), and run d's loss
# with the hot set per size class (twell.nn.hot_cold_cache.MAX_HOT_SETS, 3) against one set (1, until session 59).
#   1. the whole `-m gpu` suite, three pytest processes (its layers now record their repeated eager calls and keep a
#      hot set per size class);
#   2. scripts/eager_floor_probe.py --graphs 4, 4096-16,384 tokens in one process (the 12,288-token calls after the
#      smaller counts', as session 58's runs d-f), with one hot set per layer (--hot-sets 1), then as shipped (3);
#   3. the same probe on 12,288 tokens alone (its hot set chosen at 12,288 whatever the sets, as session 58's a-b).
# Predictions: bench_results/<gpu>/session59_runs.md, written before the call.
#   TWELL_COMMIT=<sha> [CALL_NO=k] bash scripts/gpu_session59_call1.sh
MARK=gpu GROUPS_N=3 TOTAL=290 TWELL_SESSION=session59 bash "$(dirname "$0")/gpu_kernel_tests.sh"
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session59 "${CALL_NO:-1}"
for sets in 1 3; do
  stage "probe_smaller_first_sets$sets" 110 "tokens=|Error|error" python3 scripts/eager_floor_probe.py \
    --policies default --graphs 4 --hot-sets "$sets" --tokens 4096 6144 8192 12288 16384 --reps 9 --out "$R"
  [ -f "$R/eager_floor_probe.json" ] && mv "$R/eager_floor_probe.json" "$R/probe_smaller_first_sets${sets}_call${CALL}_$S.json"
done
stage probe_12288_alone 60 "tokens=|Error|error" python3 scripts/eager_floor_probe.py --policies default \
  --graphs 4 --tokens 12288 --reps 9 --out "$R"
[ -f "$R/eager_floor_probe.json" ] && mv "$R/eager_floor_probe.json" "$R/probe_12288_alone_call${CALL}_$S.json"
call_end
