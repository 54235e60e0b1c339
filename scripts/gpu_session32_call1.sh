#!/usr/bin/env bash
# Session 32, GPU call 1: held-out layer shapes for the envelope rule (DispatchPolicy(other_shapes="envelope"), the
# default since this session: an unmeasured shape within the six measured ones' ranges, hidden 896-4096 and
# intermediate 4864-14336, runs sparse at one token to 5.59 % and from 2048 tokens to ~9.8 %, dense at 16-2047).
# The first run (seed 0) of 3072x8192 (Llama-3.2-3B's FFN), 2304x9216 (Gemma-2-2B) and 2560x9728 (Qwen3-4B), inside
# the ranges, and of 1024x3072 (Qwen3-0.6B) and 5120x13824 (Llama-2-13B), outside them, at 1 to 131,072 tokens x 6
# densities.  Predicted: the three inside win at every point the envelope sends sparse (one token by ~1.2-1.4x, from
# 2048 tokens by ~1.2-2.1x), so the check line reads "losses: none"; 5120x13824 like 4096x14336 (sparse from one
# token); 1024x3072 the weakest (like 896x4864 or worse: its one token ~1.0-1.1x, sparse only from 2048-4096 tokens).
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session32 1
MS="1 16 64 256 512 1024 2048 4096 8192 16384 32768 131072"
DENS="0.25 0.5 1 2 5 10"
for SH in 3072x8192 2304x9216 2560x9728 1024x3072 5120x13824; do
  stage tune_${SH}_a "$(left 585)" "sparse when|never won|: dense|DEFAULT_POLICY|WRONG" python3 -m twell.cli \
    tune-dispatch --shape $SH --ms $MS --densities $DENS --seed 0 --out "$R" --stem dispatch_${SH}_session32_a
done
call_end
