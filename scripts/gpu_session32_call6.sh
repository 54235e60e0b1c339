#!/usr/bin/env bash
# Session 32, GPU call 6: which kernels move when the middle tier's bound goes from 10 to 3 (calls 4-5: a win at
# 1024x3072, a loss at 2048x5632).  Kernel times per call (torch.profiler, scripts/infer_op_profile.py) at 16,384
# tokens and 1 % (l0 30 at 1024x3072, inside its table's 1 % row, 56 at 2048x5632), as shipped and with HOT_MAX_COLD_L0 = _DENSE = 3.
# Predicted: at 1024x3072 the cold gather drops by > 0.1 ms while the gate GEMM and the hot down GEMM grow by < 0.02 ms
# each (op 0.46 -> 0.36 ms); at 2048x5632 the GEMMs grow by more than the gather saves (op 0.96 -> 1.08 ms).
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session32 6
B3='import sys, runpy; import twell.ops.hot_cold_plan as h; h.HOT_MAX_COLD_L0 = h.HOT_MAX_COLD_L0_DENSE = 3.0; sys.argv = ["infer_op_profile.py"] + sys.argv[1:]; runpy.run_path("scripts/infer_op_profile.py", run_name="__main__")'
for P in 1024x3072:30 2048x5632:56; do
  SH=${P%:*} L0=${P#*:}
  stage profile_${SH}_shipped "$(left 200)" "ms/call|gather|gemm|gate|list|hot|cold|nvjet|kernel" python3 \
    scripts/infer_op_profile.py --shape $SH --points 16384:$L0
  stage profile_${SH}_bound3 "$(left 200)" "ms/call|gather|gemm|gate|list|hot|cold|nvjet|kernel" python3 -c "$B3" \
    --shape $SH --points 16384:$L0
done
call_end
