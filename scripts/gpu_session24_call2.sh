#!/usr/bin/env bash
# Session 24, GPU call 2: the 1.5B forward with the residual fusions after call 1's fixes (a fused layer is a subclass,
# so no reference cycle holds freed models; the dense path adds its residual after the down projection), A/B/A
# in-process runs (fused, unfused, fused); then the new GPU tests.  OUT, TWELL_COMMIT from the caller; files packed
# into $OUT/results_call2_session24.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src PYTHONUNBUFFERED=1
S=session24
R="$OUT/run"
mkdir -p "$R"
M="bench model --preset 1.5b --parts forward --fused-norms --fused-rope --isolation none --out $R"
for v in residual_a base_b residual_c; do
  opt=""; [[ $v == residual* ]] && opt="--fused-residual"
  timeout 100 python3 -m twell.cli $M $opt --stem model_forward_${v}_$S > "$R/model_forward_${v}_$S.log" 2>&1
  echo "forward $v rc=$?"
done
rm -rf "$R"/*_parts
for v in residual_a base_b residual_c; do echo "== $v"; tail -4 "$R/model_forward_${v}_$S.log" | head -3; done
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_ops_residual.py tests/test_nn_residual.py \
  tests/test_ops_add_norm.py tests/test_nn_mlp.py tests/test_models_gpu.py > "$R/pytest_gpu_residual_$S.log" 2>&1
echo "pytest rc=$?"; tail -3 "$R/pytest_gpu_residual_$S.log"
tar czf "$OUT/results_call2_$S.tgz" -C "$OUT" run && rm -rf "$R"
