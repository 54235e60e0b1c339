#!/usr/bin/env bash
# Session 32, GPU call 2: the second runs (seed 1) for call 1's held-out layer shapes for the envelope rule (DispatchPolicy(other_shapes="envelope"), the
# default since this session: an unmeasured shape within the six measured ones' ranges, hidden 896-4096 and
# intermediate 4864-14336, runs sparse at one token to 5.59 % and from 2048 tokens to ~9.8 %, dense at 16-2047).
# The same five shapes and points with their own draw of the synthetic activations (seed 1): a point joins a shape's
# table only where both runs won.  Call 1 (seed 0): the envelope sent 33-36 of 72 points sparse at each of the three
# shapes inside the ranges and all won (lowest 1.17x, 3072x8192 at 2048 tokens / 2 %).  Predicted: the same, "losses:
# none" again with the lowest speedups within ~0.05x of call 1's.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session32 2
MS="1 16 64 256 512 1024 2048 4096 8192 16384 32768 131072"
DENS="0.25 0.5 1 2 5 10"
for SH in 3072x8192 2304x9216 2560x9728 1024x3072 5120x13824; do
  stage tune_${SH}_b "$(left 585)" "sparse when|never won|: dense|DEFAULT_POLICY|WRONG" python3 -m twell.cli \
    tune-dispatch --shape $SH --ms $MS --densities $DENS --seed 1 --out "$R" --stem dispatch_${SH}_session32_b
done
call_end
