#!/usr/bin/env bash
# One call on the GPU machine: the stages named in $STAGES (default: all), each under its own time
# limit, so that one slow or failing stage leaves the others' results.  Everything lands under
# $OUT/run/ and is packed into $OUT/results.tgz (the device tool returns at most 8 files), with each
# stage's log tail printed last.
#
#   STAGES="tests ffn train-ffn model" OUT=/tmp/o TWELL_COMMIT=$(git rev-parse HEAD) bash scripts/gpu_all.sh
#
# Stage limits (seconds) come from T_<STAGE> (e.g. T_FFN=200); extra arguments per stage from
# ARGS_<STAGE> (e.g. ARGS_FFN="--ms 4096 131072").
. "$(dirname "$0")/gpu_call_lib.sh"  # set -uo pipefail, the repository root, write_environment
export PYTHONPATH=src  # this runner's stages import twell only
OUT=${OUT:-out}
RUN="$OUT/run"
mkdir -p "$RUN"
STAGES=${STAGES:-"tests ffn train-ffn model"}
# Other stages: ffn-large (a second ffn sweep, ARGS_FFN_LARGE), tune (twell tune-dispatch, ARGS_TUNE), probe coldfmt trainprof decodeprobe decodestep switchovh launchcost coldprobe (ARGS_COLDPROBE, e.g. --shape 4096x14336) l2probe colddown timing gemmprobe fusedgate fusedab (ARGS_FUSEDAB: switches of hot_cold_gate_kernel toggled together) attn ncu ncusrc clock overhead (the
# diagnostics).
write_environment "$RUN/environment.txt"

run_stage() {  # name, default limit, command...
  local name=$1 limit=$2
  shift 2
  local var="T_${name//-/_}"
  var=${var^^}
  limit=${!var:-$limit}
  local start=$SECONDS
  echo "== $name (limit ${limit}s)" | tee -a "$RUN/stages.txt"
  timeout "$limit" "$@" > "$RUN/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc in $((SECONDS - start))s" | tee -a "$RUN/stages.txt"
}

for stage in $STAGES; do
  case $stage in
    # the whole GPU suite took 358 s in session 24 (164 tests)
    tests) run_stage tests 420 python3 -m pytest tests -q -m gpu -p no:cacheprovider ${ARGS_TESTS:-} ;;
    ffn) run_stage ffn 240 python3 -m twell.cli bench ffn --out "$RUN" --stem ffn ${ARGS_FFN:-} ;;
    tune) run_stage tune 300 python3 -m twell.cli tune-dispatch --out "$RUN" ${ARGS_TUNE:---shape 2048x5632} ;;
    ffn-large) run_stage ffn-large 240 python3 -m twell.cli bench ffn --out "$RUN" --stem ffn_large ${ARGS_FFN_LARGE:-} ;;
    train-ffn) run_stage train-ffn 240 python3 -m twell.cli bench train-ffn --out "$RUN" --stem train_ffn ${ARGS_TRAIN_FFN:-} ;;
    # the headline's flags by default (session 24: forward 1.370x / 1.373x with them)
    model) run_stage model 240 python3 -m twell.cli bench model --out "$RUN" \
      ${ARGS_MODEL:---fused-norms --fused-rope --fused-residual} ;;
    probe) run_stage probe 200 python3 scripts/hot_cold_probe.py ;;
    coldfmt) run_stage coldfmt 150 python3 scripts/cold_format_probe.py ;;
    trainprof) run_stage trainprof 120 python3 scripts/train_hot_cold_profile.py ${ARGS_TRAINPROF:-} ;;
    decodeprobe) run_stage decodeprobe 90 python3 scripts/decode_probe.py ${ARGS_DECODEPROBE:-} ;;
    decodestep) run_stage decodestep 150 python3 scripts/decode_step_profile.py ${ARGS_DECODESTEP:-} ;;
    launchcost) run_stage launchcost 90 python3 scripts/launch_overhead.py ;;
    coldprobe) run_stage coldprobe 240 python3 scripts/cold_pack_gather_probe.py ${ARGS_COLDPROBE:-} ;;
    l2probe) run_stage l2probe 120 python3 scripts/l2_gather_probe.py ;;
    colddown) run_stage colddown 200 python3 scripts/cold_down_probe.py ;;
    timing) run_stage timing 200 python3 scripts/timing_probe.py ;;
    gemmprobe) run_stage gemmprobe 150 python3 scripts/triton_gemm_probe.py ;;
    fusedgate) run_stage fusedgate 300 python3 scripts/hot_cold_gate_probe.py ;;
    fusedab) run_stage fusedab 240 python3 scripts/fused_gate_ab.py ${ARGS_FUSEDAB:-FUSED_PTX_SLOTS} ;;
    attn) run_stage attn 120 python3 scripts/attention_probe.py ;;
    ncu) run_stage ncu 240 ncu --clock-control none -k "regex:${NCU_KERNELS:-_hot_cold_gate|_twell_ffn_row}" -c "${NCU_COUNT:-2}" \
           --section SpeedOfLight --section WarpStateStats --section Occupancy --section SourceCounters \
           python3 scripts/ncu_targets.py ${ARGS_NCU:-} ;;
    ncusrc) run_stage ncusrc 240 bash -c "ncu --clock-control none -k 'regex:${NCU_KERNELS:-_hot_cold_gate}' \
           -c ${NCU_COUNT:-1} --section SourceCounters --section WarpStateStats -f -o '$RUN/ncusrc' \
           python3 scripts/ncu_targets.py ${ARGS_NCU:-} && ncu -i '$RUN/ncusrc.ncu-rep' --page source \
           --print-source sass --csv > '$RUN/ncusrc_sass.csv'" ;;
    clock) run_stage clock 150 python3 scripts/clock_probe.py ;;
    switchovh) run_stage switchovh 120 python3 scripts/train_switch_overhead.py ${ARGS_SWITCHOVH:-} ;;
    overhead) run_stage overhead 120 python3 scripts/module_overhead.py --device cuda ${ARGS_OVERHEAD:-} ;;
    *) echo "unknown stage $stage" | tee -a "$RUN/stages.txt" ;;
  esac
done
tar czf "$OUT/results.tgz" -C "$OUT" run
for stage in $STAGES; do
  echo "---------------- $stage"
  tail -n 30 "$RUN/$stage.log" 2>/dev/null
done
cat "$RUN/stages.txt"
