#!/usr/bin/env bash
# Session 59, GPU call 1 (one call: the device was scarce this session; each failed start cost 1-2 minutes):
#   1. scripts/hot_sets_probe.py: the synthetic 2048x5632 layer (l0 28) whose first call (4096 tokens) chose the set,
#      then 16,384 and 131,072-token calls, one hot set per layer (the behaviour until session 59) against a set per
#      size class (twell.nn.hot_cold_cache.MAX_HOT_SETS = 3, shipped), interleaved with dense, the GPU held;
#   2. run d's loss: scripts/eager_floor_probe.py --graphs 4 on 4096, 12,288 and 16,384 tokens in one process (the
#      12,288-token calls after the 4096-token ones, as session 58's runs d-f), --hot-sets 1 then 3;
#   3. the whole `-m gpu` suite, three pytest processes, in what is left of the call (session 58's call 5: every
#      layer records its repeated eager calls by default, and now keeps a hot set per size class).
# Predictions: bench_results/<gpu>/session59_runs.md, written before the call.
#   TWELL_COMMIT=<sha> [CALL_NO=k] bash scripts/gpu_session59_call1.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session59 "${CALL_NO:-1}"
stage hot_sets_probe 120 "tokens=|Error|error" python3 scripts/hot_sets_probe.py --out "$R"
[ -f "$R/hot_sets_probe.json" ] && mv "$R/hot_sets_probe.json" "$R/hot_sets_probe_call${CALL}_$S.json"
for sets in 1 3; do
  stage "probe_smaller_first_sets$sets" 85 "tokens=|Error|error" python3 scripts/eager_floor_probe.py \
    --policies default --graphs 4 --hot-sets "$sets" --tokens 4096 12288 16384 --reps 9 --out "$R"
  [ -f "$R/eager_floor_probe.json" ] && mv "$R/eager_floor_probe.json" "$R/probe_smaller_first_sets${sets}_call${CALL}_$S.json"
done
suite_s=$(left 540)  # the suite collects its files (~20 s) before its limit starts
call_end
MARK=gpu GROUPS_N=3 TOTAL=$suite_s TWELL_SESSION=session59 bash "$(dirname "$0")/gpu_kernel_tests.sh"
