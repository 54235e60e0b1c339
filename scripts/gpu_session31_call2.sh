#!/usr/bin/env bash
# Session 31, GPU call 2: the second dispatch runs of call 1's shapes (4096 x 11008, 2048 x 8192, 1536 x 8960; a
# point joins a shipped table only where both runs won, `twell tune-dispatch --from`), and two runs of 896 x 4864
# (Qwen2-0.5B's FFN).  Predicted: the second runs within ~0.06x of the first at every point (session 30's two runs
# below 1024 tokens differed by at most 0.055x); 896 x 4864 dense at 16-1023 tokens, sparse from ~2048 tokens.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session31 2
MS="1 16 64 256 512 1024 2048 4096 8192 16384 32768 131072"
DENS="0.25 0.5 1 2 5 10"
for SH in 4096x11008 2048x8192 1536x8960; do
  stage tune_${SH}_b "$(left 585)" "sparse when|never won|: dense" python3 -m twell.cli tune-dispatch --shape $SH \
    --ms $MS --densities $DENS --seed 1 --out "$R" --stem dispatch_${SH}_session31_b
done
for RUN in a b; do
  stage tune_896x4864_$RUN "$(left 585)" "sparse when|never won|: dense" python3 -m twell.cli tune-dispatch \
    --shape 896x4864 --ms $MS --densities $DENS --seed $([ $RUN = a ] && echo 0 || echo 1) --out "$R" \
    --stem dispatch_896x4864_session31_$RUN
done
call_end
