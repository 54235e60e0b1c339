#!/usr/bin/env bash
# Session 59, GPU call 1b: part 1 of call 1 alone (scripts/hot_sets_probe.py), for the session's last ~5 minutes of
# device time (every request of the session until then found no machine).  Predictions: bench_results/<gpu>/session59_runs.md (call 1, 1).
#   TWELL_COMMIT=<sha> [CALL_NO=k] bash scripts/gpu_session59_call1b.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session59 "${CALL_NO:-1b}"
stage hot_sets_probe 170 "tokens=|Error|error" python3 scripts/hot_sets_probe.py --out "$R"
[ -f "$R/hot_sets_probe.json" ] && mv "$R/hot_sets_probe.json" "$R/hot_sets_probe_call${CALL}_$S.json"
call_end
