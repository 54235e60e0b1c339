#!/usr/bin/env bash
# The third prepared GPU call: an ncu look at the batch up kernel, then session 34's call 3 (the suite moved to call
# 1): where the 1.5B model's compiled, graphed batch-8 step spends its GPU time, dense against the shipped policy's
# decode tables (scripts/decode_step_profile.py: torch.profiler over replays of the recorded step).  Session 33's
# synthetic figures predicted ~6 us saved per layer at eight tokens, ~7 % of the step; the model's decode gained
# 1.8 %.  Run it as
#   TWELL_SESSION=session36 TWELL_COMMIT=<sha> bash scripts/gpu_pending_call3.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session36}" 3
# Why the batch up kernel takes 10-11 us at any BK (session 33: ncu 11.4 us at eight tokens, SMs active 9,561 of
# 21,146 cycles; the op 0.0334 ms at BK 128, 256, 512 and 1024 alike) for ~2 MB of Wu rows (~470 firing units): its
# stall reasons, scheduler and memory tables and source counters (uncoalesced or excess sectors), eight tokens,
# d=2048, 0.5 %.
stage ncu_batch_up "$(left 150)" \
  "^  _|Duration|Stall|stalled|Elapsed|SM Active|Issued|Eligible|uncoalesced|excessive|Sectors" \
  ncu --clock-control none -k "regex:_batch_up" -c 2 --section SpeedOfLight --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis_Tables --section SourceCounters \
  python3 scripts/ncu_targets.py --target batch --ms 8
stage decode_step_profile_b8 "$(left 560)" "per replayed step|profiled|decode|linear|gemm|nvjet|Kernel" \
  python3 scripts/decode_step_profile.py --batch 8 --policy default --compile --fused-norms --variants dense,sparse
call_end
