#!/usr/bin/env bash
# Session 39, on an H100: does the one loss of the H200 tables there repeat?  scripts/gpu_pending_h100.sh's second
# run (seed 1) timed 2048x5632 at 512 tokens / 0.5 % at 0.93x of dense (seed 0: 1.13x; the H200 table sends 512-1023
# tokens sparse to ~1 %, won there 1.16-1.26x in session 30's two runs).  This times 256, 512 and 1024 tokens again,
# seed 1 and a new seed 2.  Predicted: 512 tokens at 0.5 % between 0.93x and 1.13x; if both runs win by >= 1.0x the
# loss was the run's, not the H100's.
#   TWELL_SESSION=session39 TWELL_COMMIT=<sha> bash scripts/gpu_session39_h100_mid.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session39}" h100mid
for seed in 1 2; do
  stage "tune_h100_2048x5632_mid_s$seed" "$(left 170)" "M=    512|DEFAULT_POLICY|WRONG|ERROR|Error" \
    python3 -m twell.cli tune-dispatch --shape 2048x5632 --ms 256 512 1024 --seed "$seed" --out "$R" \
    --stem "dispatch_2048x5632_h100_${S}_mid_s$seed"
done
call_end
