#!/usr/bin/env bash
# Session 31, GPU call 1.
# (a) Session 30's fix, not yet timed: the middle tier's dense-layer bound now splits on density
#     (hot_cold_plan.HOT_DENSE_DENSITY = 1.25 %), so 4096 x 14336 at 0.5-1 % gets bound 10 again.  Predicted:
#     16,384 tokens / 0.5 % back at session 27's ~1.69x (1.58x in session 30 with bound 6); tune-dispatch at 16,384 and
#     32,768 tokens, 0.5-3 %, as shipped against the bound 10 everywhere (HOT_DENSE_DENSITY=1.0): level at 0.5-1 %,
#     shipped ahead by ~0.04-0.07x at 1.5-3 % (what bound 6 gave at 2048 x 5632 in session 29).
# (b) Dispatch tables for common layer shapes that have none (they run dense today): the first of two runs for
#     4096 x 11008 (Llama-2-7B's FFN), 2048 x 8192 (Llama-3.2-1B) and 1536 x 8960 (Qwen2-1.5B), 1 to 131,072 tokens
#     at 6 densities.  Predicted: 4096 x 11008 like 4096 x 14336 (wins from one token except near 256 tokens above
#     0.5 %); 2048 x 8192 and 1536 x 8960 like 2048 x 5632 (one token and from 512 tokens sparse, 16-256 dense).
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session31 1
MS="1 16 64 256 512 1024 2048 4096 8192 16384 32768 131072"
DENS="0.25 0.5 1 2 5 10"
stage ffn_4096x14336_split "$(left 120)" "speedup=|^\| " python3 -m twell.cli bench ffn --shape 4096x14336 \
  --ms 16384 --densities 0.5 1 --extra --out "$R" --stem ffn_4096x14336_split_session31
stage tune_4096x14336_split_shipped "$(left 180)" "x  err|sparse when" python3 -m twell.cli tune-dispatch \
  --shape 4096x14336 --ms 16384 32768 --densities 0.5 1 1.5 2 3 --out "$R" --stem dispatch_4096x14336_session31_split
stage tune_4096x14336_split_bound10 "$(left 240)" "x  err|sparse when" python3 scripts/twell_patched.py \
  --set twell.ops.hot_cold_plan.HOT_DENSE_DENSITY=1.0 -- tune-dispatch --shape 4096x14336 --ms 16384 32768 \
  --densities 0.5 1 1.5 2 3 --out "$R" --stem dispatch_4096x14336_session31_bound10
for SH in 4096x11008 2048x8192 1536x8960; do
  stage tune_${SH}_a "$(left 585)" "sparse when|never won|: dense" python3 -m twell.cli tune-dispatch --shape $SH --ms $MS \
    --densities $DENS --out "$R" --stem dispatch_${SH}_session31_a
done
call_end
