#!/usr/bin/env bash
# Session 34, GPU call 1: `twell tune-decode` (new) at the two shapes of the decode sweep, then as many of the other
# measured shapes as the call's time allows.  Predicted from session 33's sweep (decode_probe_final_call6_session33.log):
# 2048x5632 wins by >= 1.05x up to ~2 % at 1-16 tokens and ~0.5-1 % at 32-64; 4096x14336 up to 2 % at 1-2 tokens,
# ~0.5-1 % at 4-32, dense at 64 from 0.5 %.  Every point's output is checked against fp32.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session34 1
for shape in 2048x5632 4096x14336 2048x8192 1536x8960 896x4864 4096x11008; do
  stage "tune_decode_$shape" "$(left 560)" "^decode table|<= M|python:|WRONG|ERROR|Error" \
    python3 -m twell.cli tune-decode --shape "$shape" --rep-ms 50 --out "$R"
done
call_end
