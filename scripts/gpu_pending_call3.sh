#!/usr/bin/env bash
# The third prepared GPU call (session 34's call 3, after the suite moved to call 1): where the 1.5B model's compiled,
# graphed batch-8 step spends its GPU time, dense against the shipped policy's decode tables
# (scripts/decode_step_profile.py: torch.profiler over replays of the recorded step).  Session 33's synthetic figures
# predicted ~6 us saved per layer at eight tokens, ~7 % of the step; the model's decode gained 1.8 %.  Run it as
#   TWELL_SESSION=session36 TWELL_COMMIT=<sha> bash scripts/gpu_pending_call3.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session36}" 3
stage decode_step_profile_b8 "$(left 560)" "per replayed step|profiled|decode|linear|gemm|nvjet|Kernel" \
  python3 scripts/decode_step_profile.py --batch 8 --policy default --compile --fused-norms --variants dense,sparse
call_end
