#!/usr/bin/env bash
# Session 28, GPU call 4: is the module's dense-row budget what costs it 1.34x against the op's 1.43x at 16384 / 2 %
# (call 1)?  `twell bench ffn` at 16384 tokens and 1 / 2 / 5 %, as shipped and with hot_cold_cache.DENSE_OVERFLOW_ROWS
# off (the module's budget 0, as the bench's op column runs), each run timing dense, the op and the module interleaved.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin session28 4
for ROWS in True False; do
  stage ffn_dense_rows_$ROWS "$(left 280)" "^\| 2048" python3 -c "
import sys
import twell.nn.hot_cold_cache as c
c.DENSE_OVERFLOW_ROWS = $ROWS
from twell.cli import main
sys.exit(main(sys.argv[1:]))" bench ffn --shape 2048x5632 --ms 16384 --densities 1 2 5 --extra --out "$R" \
    --stem ffn_16384_dense_rows_${ROWS}_session28
done
call_end
