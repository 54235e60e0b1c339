#!/usr/bin/env bash
# Session 38, call 1: the GPU suite at the commit that holds the default dispatch to Hopper (session 37: 188 GPU tests
# expected, 187 passed in session 35 in 392 s, plus test_gpu_capability_is_a_constant_of_a_compiled_graph), then, in
# what is left of the call, the batch decode up kernel's probe (scripts/gpu_pending_call1.sh's first stage and its
# prediction: one warp (512, 3, 1) or two (512, 3, 2) 10 -> ~5-7 us at d=2048, eight tokens).
#   TWELL_SESSION=session38 TWELL_COMMIT=<sha> bash scripts/gpu_session38_call1.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session38}" 1
stage pytest_gpu_all "$(left 480)" "passed|failed|FAILED|Error" python3 -m pytest tests -q -m gpu -p no:cacheprovider
stage batch_up_probe "$(left 585)" "d=|FAILED|Error" python3 scripts/batch_up_probe.py
call_end
