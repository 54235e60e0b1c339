#!/usr/bin/env bash
# Session 30, GPU call 5: the whole 2048 x 5632 sweep at the final commit (the README's table; its 131,072 and
# 524,288-token rows were session 27's), with the dispatch as shipped after calls 1-3.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session30 5
stage ffn_sweep "$(left 585)" "^\| 2048" python3 -m twell.cli bench ffn --shape 2048x5632 \
  --ms 1 16 256 1024 2048 4096 16384 131072 --out "$R" --stem ffn_sweep_session30
call_end
