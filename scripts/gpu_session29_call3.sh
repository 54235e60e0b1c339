#!/usr/bin/env bash
# Session 29, GPU call 3: the FFN sweep at the sizes whose dispatch or hot set moved this session (1024 tokens sparse
# to 1 %; the middle tier's bound 6 from l0 70; the dense-row pass from 16 expected rows); 131,072 tokens and more
# keep their rule (call 2 measured them) and are left out for the device time left.  Predicted (call 2's tuning):
# 1024 / 0.25-1 % ~1.2-1.4x, 16384 / 2 % ~1.43x (session 27's sweep: 1.26-1.40x at 2-10 %).
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session29 3
stage ffn_sweep "$(left 380)" "speedup=|^\|" python3 -m twell.cli bench ffn --shape 2048x5632 \
  --ms 1024 4096 8192 16384 32768 --extra --out "$R" --stem ffn_sweep_session29
call_end
