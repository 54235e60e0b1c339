#!/usr/bin/env bash
# Session 34, GPU call 3: the whole GPU suite (the new GPU test of a recorded call following the shipped decode table
# among it), then where the 1.5B model's compiled, graphed batch-8 step spends its GPU time, dense against the shipped
# policy's decode tables (scripts/decode_step_profile.py: torch.profiler over replays of the recorded step).  Session
# 33's synthetic figures predicted ~6 us saved per layer at eight tokens, ~7 % of the step; the model's decode gained 1.8 %.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session34 3
stage pytest_gpu_all "$(left 420)" "FAILED|passed|failed" python3 -m pytest -q -m gpu -p no:cacheprovider tests
stage decode_step_profile_b8 "$(left 560)" "per replayed step|profiled|decode|linear|gemm|nvjet|Kernel" \
  python3 scripts/decode_step_profile.py --batch 8 --policy default --compile --fused-norms --variants dense,sparse
call_end
