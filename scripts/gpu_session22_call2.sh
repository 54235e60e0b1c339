#!/usr/bin/env bash
# Session 22, GPU call 2: the whole GPU suite, the forward's per-layer FFN times with the dense rows on and off,
# and the 1.5B forward benchmark with them on and off (same machine, one call).  OUT, TWELL_COMMIT from the caller;
# everything lands in $OUT/results_call2_session22.tgz (the device tool returns at most 8 files).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src PYTHONUNBUFFERED=1
S=session22
R="$OUT/run"
mkdir -p "$R"
timeout 300 python3 -m pytest tests -q -m gpu -p no:cacheprovider > "$R/pytest_gpu_all_$S.log" 2>&1; echo "pytest rc=$?"
timeout 90 python3 scripts/forward_layer_times.py > "$R/forward_layer_times_dense_rows_$S.log" 2>&1; echo "layers rc=$?"
timeout 90 python3 scripts/forward_layer_times.py --no-dense-rows > "$R/forward_layer_times_no_dense_rows_$S.log" 2>&1
echo "layers off rc=$?"
M="bench model --preset 1.5b --parts forward --fused-norms --fused-rope --out $R"
timeout 100 python3 -m twell.cli $M --stem model_forward_dense_rows_$S > "$R/model_forward_dense_rows_$S.log" 2>&1
echo "model rc=$?"
timeout 100 python3 -c "import sys; import twell.nn.hot_cold_cache as h; h.DENSE_OVERFLOW_ROWS = False; \
from twell.cli import main; sys.exit(main(sys.argv[1:]))" $M --stem model_forward_no_dense_rows_$S \
  > "$R/model_forward_no_dense_rows_$S.log" 2>&1
echo "model off rc=$?"
tail -3 "$R/pytest_gpu_all_$S.log"
for f in forward_layer_times_dense_rows forward_layer_times_no_dense_rows; do head -6 "$R/${f}_$S.log"; tail -1 "$R/${f}_$S.log"; done
tail -6 "$R/model_forward_dense_rows_$S.log"; tail -6 "$R/model_forward_no_dense_rows_$S.log"
rm -rf "$R"/*_parts
