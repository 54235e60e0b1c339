#!/usr/bin/env bash
# Session 33, GPU call 4.  (1) ncu of the batch decode kernels at 2 and 8 tokens (d=2048, F=5632, 0.5 %): call 2 timed
# the up kernel at 10.2 us and the down kernel with its partial sum at 7.7-8.6 us under CUDA graphs for a few MB of
# weight rows; which of latency, occupancy or waves bounds them.  (2) The 1.5B model's graphed greedy decode at batches
# 2 and 8 under "decode" (decode_max_tokens 64: the batch kernels for every step) against "decode-1" (dense FFN from two
# tokens) and dense.  Predicted: the FFN 2-3 us a layer faster (28 layers, ~0.06-0.1 ms of a ~2-2.4 ms step): "decode"
# ~1.02-1.05x of dense, "decode-1" ~1.0x.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session33 4
stage ncu_batch_decode "$(left 150)" "^  _|^  nvjet|^  [a-z_]+gemm|Duration|Registers Per|Achieved Occupancy|Waves Per SM|Memory Throughput|DRAM Throughput" \
  ncu --clock-control none -k "regex:_batch|_partial|nvjet|gemm" -c 16 --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section WarpStateStats python3 scripts/ncu_targets.py --target batch --ms 2 8
stage model_decode_batch "$(left 560)" "^\| decode|^total" python3 -m twell.cli bench model --preset 1.5b --parts decode \
  --fused-norms --fused-residual --decode-loop graphed --decode-compile --decode-policies decode-1,decode \
  --decode-batches 2,8 --out "$R" --stem model_decode_batch_kernels_session33
call_end
