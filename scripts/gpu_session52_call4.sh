#!/usr/bin/env bash
# Session 52, GPU call 4: where a 2048-token call of the synthetic 2048x5632 layer with a steep sequence head goes.
# Call 3 (PART=3, tune-dispatch --early-boost 40 --early-decay 4, the module held sparse) ran it at 0.70x of dense at
# 0.5 % (0.322 ms against 0.161 with the default head), 0.83x at 0.25 %, 1.00x at 1 %, whatever the long-row bound.
# The kernels of the module and of the op per call (scripts/infer_op_profile.py), steep head then the default one.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session52 4
nvidia-smi --query-gpu=name --format=csv,noheader
stage profile_head40 "$(left 150)" "^M=|^ +[0-9]" python3 scripts/infer_op_profile.py --policy sparse \
  --early-boost 40 --early-decay 4 --points 2048:28 2048:56
stage profile_head4 "$(left 230)" "^M=|^ +[0-9]" python3 scripts/infer_op_profile.py --policy sparse --points 2048:28
call_end
