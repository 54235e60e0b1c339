#!/usr/bin/env bash
# Session 32's next step (a), where the hot/cold op leaves the GPU idle at 1024 x 3072: there (16,384 tokens, l0 30 of
# 3072 units: ~1 %, session 32 call 6) its kernels summed to 0.388 ms while the timed call took 0.462 ms (call 4) or
# 0.422 (call 7).  Session 40's first run (calltimeline, H100) profiled each call after a synchronize, so each call
# started on an idle GPU and its gaps were the host's issuing (450-560 us before the fused gate kernel; the op's host
# time a call is 442-957 us, op_host_time_*_session40.log).  This run holds the GPU 2 ms before each call, as the
# benchmarks' timing does (`infer_op_profile.py --hold-ms 2`), so the gaps left are the GPU's own; also the
# kernel_timeline GPU test of the hold.
# Predicted: at 1024 x 3072 idle ~0.03-0.07 ms of a ~0.42-0.46 ms span, in gaps between kernels that wait on one
# another (launch latency of dependents); at 2048 x 5632 / 16,384 tokens, l0 56, idle < 5 %.  ~2 minutes.
#   TWELL_SESSION=session40 TWELL_COMMIT=<sha> bash scripts/gpu_pending_timeline.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session40}" "timeline${RUN:-2}"
stage pytest_gpu_timeline "$(left 90)" "passed|failed|FAILED|Error" \
  python3 -m pytest tests/test_kernel_timeline.py -q -m gpu -p no:cacheprovider
stage timeline_1024x3072 "$(left 200)" "timeline|calls, medians|gap |kernels .* ms/call|Error" \
  python3 scripts/infer_op_profile.py --shape 1024x3072 --points 8192:30 16384:30 --timeline --hold-ms 2
stage timeline_2048x5632 "$(left 300)" "timeline|calls, medians|gap |kernels .* ms/call|Error" \
  python3 scripts/infer_op_profile.py --shape 2048x5632 --points 16384:56 --timeline --hold-ms 2
call_end
