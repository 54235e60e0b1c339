#!/usr/bin/env bash
# Prepared in session 39: session 32's next step (a), where the hot/cold op leaves the GPU idle at 1024 x 3072.
# There (16,384 tokens, l0 30 of 3072 units: ~1 %, session 32 call 6) its kernels summed to 0.388 ms while the timed
# call took 0.462 ms (call 4) or 0.422 (call 7), and neither the list pass beside the gate nor the overflow rows' dense
# GEMMs was the cause.  Nsight Systems does not run on these machines, so `scripts/infer_op_profile.py --timeline`
# reads each call's kernel intervals from torch.profiler (twell.bench.kernel_timeline): span, busy, overlap, and the
# largest gaps with the kernels on both sides.  2048 x 5632 at 16,384 tokens, l0 56 (~1 %), is the comparison: there
# session 32's kernel times moved as the timed call did.
# Predicted: at 1024 x 3072 idle ~0.03-0.07 ms of a ~0.42-0.46 ms span, in a few gaps between kernels that wait on one
# another (the op's kernels are 20-120 us here, so a launch or a dependency wait shows); at 2048 x 5632 idle < 5 %.
# No per-call host read was found in the op's source (the plan's host reads happen at refresh), so a gap after a
# device-to-host copy would be a surprise.  ~1-2 minutes.
#   TWELL_SESSION=session40 TWELL_COMMIT=<sha> bash scripts/gpu_pending_timeline.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session40}" timeline
stage timeline_1024x3072 "$(left 200)" "timeline:|calls, medians|gap |kernels .* ms/call|Error" \
  python3 scripts/infer_op_profile.py --shape 1024x3072 --points 8192:30 16384:30 --timeline
stage timeline_2048x5632 "$(left 300)" "timeline:|calls, medians|gap |kernels .* ms/call|Error" \
  python3 scripts/infer_op_profile.py --shape 2048x5632 --points 16384:56 --timeline
call_end
