#!/usr/bin/env bash
# Session 39, call 2: the whole GPU suite with the batch decode up kernel's new launch values shipped
# (decode_batch_kernels: (256, 3, 2) at 1-16 tokens, (128, 3, 1) at 17-32; call 1 ran the decode GPU tests with them),
# then scripts/gpu_pending_call1.sh's tunes: `twell tune-dispatch --shape 1536x8960 --ms 1 2 4 8 16`, seeds 0 and 1.
# Predicted: every GPU test passes (188 in session 38); 1536x8960 at 2-8 tokens wins near one token's 1.05-1.50x at
# <= 1 %, as 2048x5632's 2-8 tokens won to 1.3-6.0 % in session 35 (with the slower up kernel).
# Session 35 ran the suite (392 s) and two such tunes in one call.
#   TWELL_SESSION=session39 TWELL_COMMIT=<sha> bash scripts/gpu_session39_call2.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session39}" 2
stage pytest_gpu_all "$(left 420)" "passed|failed|FAILED|Error" python3 -m pytest tests -q -m gpu -p no:cacheprovider
for seed in 0 1; do
  stage "tune_1536x8960_below16_s$seed" "$(left 585)" "<= M|DEFAULT_POLICY|WRONG|ERROR|Error" \
    python3 -m twell.cli tune-dispatch --shape 1536x8960 --ms 1 2 4 8 16 --seed "$seed" --out "$R" \
    --stem "dispatch_1536x8960_${S}_below16_s$seed"
done
call_end
