#!/usr/bin/env bash
# Session 24, GPU call 1: the residual fusions (twell.nn.fuse_residual_adds; the add + norm pass and the residual in
# the MLP's last kernel) in the 1.5B forward, every variant alike, A/B in-process runs: with both, without any, with
# the MLP's only (a python -c wrapper sets twell.nn.residual.FUSE_ADD_NORM = False); then the per-op probe and the
# new GPU tests.  OUT, TWELL_COMMIT from the caller; files packed into $OUT/results_call1_session24.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src PYTHONUNBUFFERED=1
S=session24
R="$OUT/run"
mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$R/environment_$S.txt" 2>&1
M="bench model --preset 1.5b --parts forward --fused-norms --fused-rope --isolation none --out $R"
NOAN="import sys; import twell.nn.residual as r; r.FUSE_ADD_NORM = False; from twell.cli import main; \
sys.exit(main(sys.argv[1:]))"
timeout 100 python3 -m twell.cli $M --fused-residual --stem model_forward_residual_$S \
  > "$R/model_forward_residual_$S.log" 2>&1
echo "forward fused residual rc=$?"
timeout 100 python3 -m twell.cli $M --stem model_forward_base_$S > "$R/model_forward_base_$S.log" 2>&1
echo "forward base rc=$?"
timeout 100 python3 -c "$NOAN" $M --fused-residual --stem model_forward_residual_mlp_only_$S \
  > "$R/model_forward_residual_mlp_only_$S.log" 2>&1
echo "forward MLP residual only rc=$?"
rm -rf "$R"/*_parts
for v in residual base residual_mlp_only; do echo "== $v"; tail -4 "$R/model_forward_${v}_$S.log"; done
timeout 90 python3 scripts/residual_probe.py > "$R/residual_probe_$S.log" 2>&1
echo "probe rc=$?"; cat "$R/residual_probe_$S.log"
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_ops_residual.py tests/test_nn_residual.py \
  tests/test_ops_add_norm.py tests/test_nn_mlp.py tests/test_models_gpu.py > "$R/pytest_gpu_residual_$S.log" 2>&1
echo "pytest rc=$?"; tail -5 "$R/pytest_gpu_residual_$S.log"
tar czf "$OUT/results_call1_$S.tgz" -C "$OUT" run && rm -rf "$R"
