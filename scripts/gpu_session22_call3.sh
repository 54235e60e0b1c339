#!/usr/bin/env bash
# Session 22, GPU call 3: the 1.5B forward in this process (--isolation none, so that a module constant set here
# reaches the part) with the dense rows on, on with the one-GEMM q/k/v projections, and off; the new GPU tests;
# the FFN sweep's rows whose dispatch changed (1024 and 2048 tokens).  OUT, TWELL_COMMIT from the caller; the run
# folder is packed into $OUT/results_call3_session22.tgz (the device tool returns at most 8 files).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src PYTHONUNBUFFERED=1
S=session22
R="$OUT/run"
mkdir -p "$R"
M="bench model --preset 1.5b --parts forward --fused-norms --fused-rope --isolation none --out $R"
OFF="import sys; import twell.nn.hot_cold_cache as h; h.DENSE_OVERFLOW_ROWS = False; from twell.cli import main; \
sys.exit(main(sys.argv[1:]))"
timeout 80 python3 -m twell.cli $M --stem model_forward_dense_rows_$S > "$R/model_forward_dense_rows_$S.log" 2>&1
echo "model on rc=$?"
timeout 80 python3 -m twell.cli $M --fused-qkv --stem model_forward_dense_rows_qkv_$S \
  > "$R/model_forward_dense_rows_qkv_$S.log" 2>&1
echo "model on + qkv rc=$?"
timeout 80 python3 -c "$OFF" $M --stem model_forward_no_dense_rows_$S > "$R/model_forward_no_dense_rows_$S.log" 2>&1
echo "model off rc=$?"
rm -rf "$R"/*_parts
for v in dense_rows dense_rows_qkv no_dense_rows; do tail -5 "$R/model_forward_${v}_$S.log"; done
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_nn_qkv.py tests/test_ops_hot_cold_dense_rows.py \
  > "$R/pytest_gpu_qkv_dense_rows_$S.log" 2>&1
echo "pytest rc=$?"; tail -2 "$R/pytest_gpu_qkv_dense_rows_$S.log"
timeout 150 python3 -m twell.cli bench ffn --shape 2048x5632 --ms 1024 2048 --extra --out "$R" --stem ffn_small_m_$S \
  > "$R/ffn_small_m_$S.log" 2>&1
echo "sweep rc=$?"; grep "M=" "$R/ffn_small_m_$S.log" | sed 's/gate(twell).*hot-cold/hot-cold/'
tar czf "$OUT/results_call3_$S.tgz" -C "$OUT" run && rm -rf "$R"
