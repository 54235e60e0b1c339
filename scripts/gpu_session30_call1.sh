#!/usr/bin/env bash
# Session 30, GPU call 1: re-tune the 4096 x 14336 dispatch table on the current op.  Its table is session 14's
# (dispatch_4096x14336_session14.json): dense below 4096 tokens, 4096 tokens sparse only to 0.5 % (1 % lost, 0.91x).
# Since then the hot set's rule changed (sessions 20-29: the 1.3 % threshold, the cold-pairs bound 3 below 8192 tokens,
# 6 / 10 by l0 in the middle tier, 13 from 131,072), measured only at 2048 x 5632.  Predicted: 4096 tokens win at
# every density (bound 3 turned 2048 x 5632's 4096-token losses at 1-3 % into 1.23-1.80x), 2048 tokens win at least
# to 1 %, 1024 tokens at 0.25-0.5 %; from 8192 tokens the old wins (1.14-2.05x) hold or grow.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session30 1
stage tune_small "$(left 330)" "x  err|sparse when" python3 -m twell.cli tune-dispatch --shape 4096x14336 \
  --ms 1024 2048 4096 8192 --out "$R" --stem dispatch_4096x14336_session30_small
stage tune_mid "$(left 460)" "x  err|sparse when" python3 -m twell.cli tune-dispatch --shape 4096x14336 \
  --ms 16384 32768 --out "$R" --stem dispatch_4096x14336_session30_mid
stage tune_large "$(left 570)" "x  err|sparse when" python3 -m twell.cli tune-dispatch --shape 4096x14336 \
  --ms 65536 131072 --densities 0.25 0.5 1 2 5 10 --out "$R" --stem dispatch_4096x14336_session30_large
call_end
