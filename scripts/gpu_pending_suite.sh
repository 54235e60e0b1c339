#!/usr/bin/env bash
# Prepared in session 41, which was lent no device machine: the whole GPU suite (the last H200 run is session 38's 188
# passed at 2e01b81; since then the plain-Python cdiv in every launcher, the module's eager hot/cold launch, the
# timeline, a layer's call recorded in a CUDA graph inside static_dispatch, and the batch up kernel back to 2c8cb42's
# without its token-tile branch), then, with what is left of the call, session 40's host-time trim timed in one process
# at 2048 x 5632 (scripts/gpu_pending_host_ab.sh's first stage).  The suite took 345.87 s on the H200 in session 38 and
# 432.01 s on an H100 in session 40; session 41 added a reduce-overhead compile test (inductor: tens of seconds).
# ~6-10 minutes; the A/B runs only if time is left (else scripts/gpu_pending_host_ab.sh).
#   TWELL_SESSION=session42 TWELL_COMMIT=<sha> bash scripts/gpu_pending_suite.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session42}" suite
nvidia-smi --query-gpu=name --format=csv,noheader
stage pytest_gpu_all "$(left 540)" "passed|failed|FAILED|Error" python3 -m pytest tests -q -m gpu -p no:cacheprovider
stage host_ab_2048x5632 "$(left 585)" "A/B|Error" \
  python3 scripts/op_host_time.py --shape 2048x5632 --points 1024:28 16384:28 --ab 7
call_end
