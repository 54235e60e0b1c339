#!/usr/bin/env bash
# Session 30, GPU call 2: below 1024 tokens.  Call 1 had 4096 x 14336 sparse at every density from 1024 tokens
# (1.19-1.50x there); both tables run dense below their first row (1024 tokens), never measured on the current op
# at 4096 x 14336.  tune-dispatch at 1-512 tokens for both shapes.  Predicted: 4096 x 14336 wins at 256-512 tokens
# to ~1 % (the weights' 352 MB read once per call is the dense FFN's floor there), loses at 1-16 tokens through the
# module's overhead; 2048 x 5632 loses below 1024 as in session 21 / 27's sweeps (0.80-1.0x at 256).
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session30 2
stage tune_4096_tiny "$(left 280)" "x  err|sparse when" python3 -m twell.cli tune-dispatch --shape 4096x14336 \
  --ms 1 16 64 256 512 --out "$R" --stem dispatch_4096x14336_session30_tiny
stage tune_2048_tiny "$(left 560)" "x  err|sparse when" python3 -m twell.cli tune-dispatch --shape 2048x5632 \
  --ms 1 16 64 256 512 --out "$R" --stem dispatch_2048x5632_session30_tiny
call_end
