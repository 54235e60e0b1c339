#!/usr/bin/env bash
# Session 45: the 1.5B model's eager forward, host against GPU time per token count (scripts/model_host_time.py).
# The H100 machine's per-layer spans (forward_layer_times_b4_calllayers_session45.log): every sparse layer 1.05-2.07 ms
# at 8192 tokens, 0.93 ms on average at 16,384, dense 0.84; no stall (eager_stall_probe).  Predicted if the host's
# issuing is the cost: sparse host ms a forward ~45-50 at 8192 tokens, about the same at 4096 and 16,384, above the
# sparse GPU ms at 4096 and 8192 (~15 and ~25) and below it at 16,384; the cProfile then names the functions.
# First run (2396791): the held host time was the causal mask's device read waiting out the hold (150 ms), and the
# sparse forward's wall clock at 8192 tokens read 37.07 ms with the l0 refresh off against eager_stall_probe's 50.0 on
# another machine; now the hold sits after the mask, the wall clock is taken with the refresh on and off, and
# eager_stall_probe runs on the same machine.  Predicted: refresh on and off within 2 % (no refresh call is timed).
#   TWELL_SESSION=session45 TWELL_COMMIT=<sha> bash scripts/gpu_session45_call1.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session45}" host
nvidia-smi --query-gpu=name --format=csv,noheader
stage model_host_time "$(left 300)" "tokens=|Error|error" \
  python3 scripts/model_host_time.py --tokens 4096 8192 16384 --out "$R"
stage eager_stall_probe "$(left 420)" "tokens=|stalls|Error|error" \
  python3 scripts/eager_stall_probe.py --tokens 4096 8192 --reps 5 --out "$R"
head -c 9000 "$R/model_host_time_profile.txt"
call_end
