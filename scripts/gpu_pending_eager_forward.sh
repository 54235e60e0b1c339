#!/usr/bin/env bash
# Session 40: the 1.5B model's eager forward at small token counts, where the host may be the bottleneck.  Session 40
# measured the hot/cold op's host time at 442-957 us a call on the GPU machines (the dense chain's 76-119 us,
# bench_results/h200/session40_runs.md), while every FFN benchmark and dispatch table times the GPU held, as a model
# whose host runs ahead.  `twell bench model` times a forward by the wall clock between two synchronisations, so it
# shows the eager, unheld case.  The headline ran 64 x 2048 tokens only; this runs 1 x 1024, 1 x 4096 and 4 x 4096
# with the default policy and always-sparse (forward only, the headline's fusions).
# Predicted (per layer: dense ~20 torch ops ~0.3 ms of host against ~0.2 ms of GPU at 1024 tokens; the sparse FFN adds
# ~0.4-0.8 ms of host): default against dense ~0.3-0.5x at 1024 tokens (the table sends 1024 tokens at 0.5 % sparse),
# ~0.8-1.0x at 4096, >= 1.3x at 16,384.  If so, the default policy needs a rule for eager calls below a few thousand
# tokens (dense unless captured in a CUDA graph or compiled).  ~4-6 minutes.
#   TWELL_SESSION=session41 TWELL_COMMIT=<sha> bash scripts/gpu_pending_eager_forward.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session41}" eagerfwd
M="bench model --preset 1.5b --parts forward --fused-norms --fused-rope --fused-residual --isolation none --out $R"
M="$M --warmup 3 --reps 15 --energy-seconds 0 --check-seqs 1"
for bs in 1x1024 1x4096 4x4096; do
  stage "model_forward_eager_$bs" "$(left $(( ${bs%%x*} == 4 ? 560 : 330 )))" "[|] forward [|]|sparsity:|Error|error" \
    python3 -m twell.cli $M --batch "${bs%%x*}" --seq "${bs##*x}" --stem "model_forward_eager_${bs}_$S"
done
call_end
