#!/usr/bin/env bash
# Session 41, call 1: the whole GPU suite (the last H200 run is session 38's 188 passed at 2e01b81; since then the
# plain-Python cdiv in every launcher, the module's eager hot/cold launch, the timeline, a layer's call recorded in a
# CUDA graph inside static_dispatch, and the batch up kernel back to 2c8cb42's without its token-tile branch), then, with
# what is left of the call, session 40's host-time trim timed in one process at 2048 x 5632
# (scripts/gpu_pending_host_ab.sh's first stage).  ~6-9 minutes.
#   TWELL_COMMIT=<sha> bash scripts/gpu_session41_call1.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session41 1
nvidia-smi --query-gpu=name --format=csv,noheader
stage pytest_gpu_all "$(left 470)" "passed|failed|FAILED|Error" python3 -m pytest tests -q -m gpu -p no:cacheprovider
stage host_ab_2048x5632 "$(left 575)" "A/B|Error" \
  python3 scripts/op_host_time.py --shape 2048x5632 --points 1024:28 16384:28 --ab 7
call_end
