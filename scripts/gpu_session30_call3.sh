#!/usr/bin/env bash
# Session 30, GPU call 3: the second run below 1024 tokens (the rule since session 28: a small size joins a dispatch
# table only where a second run agrees).  Call 2: 4096 x 14336 won at 1-64 tokens at every density (1.09-1.61x), at
# 256 tokens only to 0.5 % (1.50x / 1.08x, then 0.94-1.03x), at 512 tokens everywhere (1.16-1.30x); 2048 x 5632 won at
# 1 token everywhere (1.14-1.17x), at 512 tokens to 1 % (1.26x / 1.17x / 1.16x), and by less than 1.05x or not at all
# elsewhere below 1024.  Predicted: the same wins within ~0.1x; 16-64 tokens at 2048 x 5632 stay within 0.9-1.1x.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session30 3
stage tune_4096_tiny "$(left 280)" "x  err|sparse when" python3 -m twell.cli tune-dispatch --shape 4096x14336 \
  --ms 1 16 64 256 512 1024 --out "$R" --stem dispatch_4096x14336_session30_tiny_b
stage tune_2048_tiny "$(left 560)" "x  err|sparse when" python3 -m twell.cli tune-dispatch --shape 2048x5632 \
  --ms 1 16 64 256 512 --out "$R" --stem dispatch_2048x5632_session30_tiny_b
call_end
