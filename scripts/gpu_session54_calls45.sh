#!/usr/bin/env bash
# Session 54, GPU calls 4 and 5 as they ran (typed inline on the warm machine; kept here so the runs can be repeated):
# the recorded 1.5B forward with both causal-mask rules (twell.models.causal_mask) off and on, each in its own process,
# at 8192 tokens (call 4: CALL=4 TOKENS=8192 LIMITS="150 300" TOP=12 SAMPLES=5) and 4096 (call 5: CALL=5 TOKENS=4096
# LIMITS="85 170" TOP=6 SAMPLES=3; the 85 s cut the rules-off run after its dense forwards).  Results:
# bench_results/h100/session54_runs.md.
. "$(dirname "$0")/gpu_call_lib.sh"
read -r off_limit on_limit <<< "${LIMITS:-150 300}"
call_begin session54 "${CALL:-4}"
for args in "skipoff --no-causal-skip $off_limit" "skipon --causal-skip $on_limit"; do
  read -r label skip limit <<< "$args"
  stage "probe_${label}_${TOKENS:-8192}" "$(left "$limit")" "^tokens=.*(gpu)|^ +[0-9.]+ us +28x cudnn|Error" \
    python3 scripts/recorded_forward_probe.py --policy tables --top "${TOP:-12}" --samples "${SAMPLES:-5}" \
    --cached-weights --tokens "${TOKENS:-8192}" "$skip" --out "$R/${label}_${TOKENS:-8192}"
done
call_end
