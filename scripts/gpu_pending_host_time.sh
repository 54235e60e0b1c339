#!/usr/bin/env bash
# Session 40: the inference op's host time.  The timeline (H100, timeline_*_calltimeline_session40.log) showed each
# call, issued after a synchronize, waiting ~450-560 us between its first kernel and the fused gate kernel, and at
# 1024 x 3072 / 16,384 tokens ~0.39 ms of kernels in a ~1.2 ms span.  scripts/op_host_time.py times each function's
# host time with the GPU held (so only the issuing is timed) beside its device time, and profiles the op's Python;
# scripts/launch_overhead.py times one Triton launch through kernel[grid] against its compiled launcher called
# directly, for 2 and 20 arguments.  The first run (callhosttime): the op 442-812 us of host time a call against
# the dense chain's 76-104; a Triton launch of 2 arguments 16.3 us, 6 arguments 37.5.  This second run adds the
# op with its Triton launches stubbed (the host time of its Python and torch ops alone) and the 20-argument launch.
# Predicted: ~5 us of host time per launch argument through kernel[grid] and well under that called directly; the
# op's stubbed host time ~100-150 us of its ~450-550 (about ten torch ops at ~14 us).  ~2 minutes.
#   TWELL_SESSION=session40 TWELL_COMMIT=<sha> bash scripts/gpu_pending_host_time.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session40}" "hosttime${RUN:-2}"
stage launch_overhead "$(left 120)" " us$|FAILED|Error" python3 scripts/launch_overhead.py
for shape in 1024x3072 2048x5632; do
  stage "op_host_time_$shape" "$(left 300)" ": host|Error" \
    python3 scripts/op_host_time.py --shape "$shape" --points 1024:30 16384:30
  stage "op_host_time_stubbed_$shape" "$(left 400)" ": host|stubbed|Error" \
    python3 scripts/op_host_time.py --shape "$shape" --points 1024:30 16384:30 --stub-launches
done
call_end
