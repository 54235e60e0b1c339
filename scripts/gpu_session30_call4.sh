#!/usr/bin/env bash
# Session 30, GPU call 4: the whole GPU suite at the commit with the re-tuned tables, then the 4096 x 14336 FFN at the
# paper's 0.5 % through `twell bench ffn` (last measured at 16384 tokens in session 27: 1.69x; at 131,072 in session 16:
# 1.87x).  Predicted from call 1's tuning: 1024 tokens ~1.4x, 16384 ~1.6x, 131,072 ~1.9x.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session30 4
stage pytest_gpu_all "$(left 450)" "FAILED|passed|failed" python3 -m pytest -q -m gpu -p no:cacheprovider tests
stage ffn_4096x14336 "$(left 585)" "^\| 4096" python3 -m twell.cli bench ffn --shape 4096x14336 \
  --ms 1024 16384 131072 --densities 0.5 --extra --out "$R" --stem ffn_4096x14336_session30
call_end
