#!/usr/bin/env bash
# Session 58, GPU call 1: recorded eager calls above the eager floor (twell.nn.call_graphs.RECORD_MAX_FLOPS, new: 0 as
# shipped, so calls at or above the floor run the split eagerly).  On session 57's slower H100 host the default ran
# 0.990x of dense at 12,288 tokens (above its floor, unrecorded) in one run: the host's issuing bounds the unrecorded
# split there too.  Measured before any default moves:
#   1. the recorded calls' GPU tests, tests/test_nn_call_graphs.py;
#   2. scripts/eager_floor_probe.py at 12,288-32,768 tokens only (every count above the 8937-token floor, so both sets
#      choose their hot units on a 12,288-token call and compare the recording alone), dense / default / default with
#      eager_graphs=4 and every count up to 32,768 tokens recorded; twice (runs a and b);
#   3. the same probe below the floor at the shipped settings, 2048-8192 tokens (run c: the hosts' spread, and the
#      H200's side of session 57's figures if an H200 comes).
# Predictions: bench_results/<gpu>/session58_runs.md, written before the call.
#   TWELL_COMMIT=<sha> [CALL_NO=k] bash scripts/gpu_session58_call1.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session58 "${CALL_NO:-1}"
nvidia-smi --query-gpu=name --format=csv,noheader
stage gpu_tests_call_graphs "$(left 120)" "passed|failed|Error" python3 -m pytest -q -p no:cacheprovider \
  tests/test_nn_call_graphs.py -m "gpu or kernel" -rs
for run in a b; do
  stage "probe_above_floor_$run" "$(left 420)" "tokens=|eager floor|Error|error" python3 scripts/eager_floor_probe.py \
    --policies default --graphs 4 --record-max-tokens 32768 --tokens 12288 16384 24576 32768 --reps 9 --out "$R"
  [ -f "$R/eager_floor_probe.json" ] && mv "$R/eager_floor_probe.json" "$R/probe_above_floor_${run}_call${CALL}_$S.json"
done
stage probe_below_floor_c "$(left 560)" "tokens=|eager floor|Error|error" python3 scripts/eager_floor_probe.py \
  --policies default --graphs 4 --tokens 2048 4096 6144 8192 --reps 9 --out "$R"
[ -f "$R/eager_floor_probe.json" ] && mv "$R/eager_floor_probe.json" "$R/probe_below_floor_c_call${CALL}_$S.json"
call_end
