#!/usr/bin/env bash
# Session 40: the inference op's host time.  The timeline (H100, timeline_*_calltimeline_session40.log) showed each
# call, issued after a synchronize, waiting ~450-560 us between its first kernel and the fused gate kernel, and at
# 1024 x 3072 / 16,384 tokens ~0.39 ms of kernels in a ~1.2 ms span.  scripts/op_host_time.py times each function's
# host time with the GPU held (so only the issuing is timed) beside its device time, and profiles the op's Python;
# scripts/launch_overhead.py times one Triton launch through kernel[grid] against its compiled launcher called
# directly (never run since session 6: 61.9 us a launch then).  Predicted: the op's host time ~300-450 us a call
# (about its ~6-8 launches at ~40-60 us), above its device time at 1024-4096 tokens at both shapes, and the direct
# launcher under ~10 us.  ~2 minutes.
#   TWELL_SESSION=session40 TWELL_COMMIT=<sha> bash scripts/gpu_pending_host_time.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session40}" hosttime
stage launch_overhead "$(left 120)" " us$|FAILED|Error" python3 scripts/launch_overhead.py
stage op_host_time_1024x3072 "$(left 250)" ": host|Error" \
  python3 scripts/op_host_time.py --shape 1024x3072 --points 1024:30 4096:30 16384:30
stage op_host_time_2048x5632 "$(left 380)" ": host|Error" \
  python3 scripts/op_host_time.py --shape 2048x5632 --points 1024:28 4096:28 16384:28
call_end
