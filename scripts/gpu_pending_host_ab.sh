#!/usr/bin/env bash
# Session 40's host-time trim (a04fb03: plain-Python cdiv in the launchers, one environment read per fused-gate launch,
# the module's eager hot/cold calls straight to the launcher), timed inside one process.  Session 40's first A/B ran the
# two source trees in separate processes and the spread between them (the op 522 then 784 us a call at one point)
# exceeded the change (bench_results/h200/session40_runs.md, call hostab); `op_host_time.py --ab` flips the launch path
# round by round in one process instead (`nn.mlp.EAGER_HOT_COLD_LAUNCH`, `triton.cdiv` patched back in), with the
# outputs compared.  Predicted (CPU with launches stubbed: the module's call 97.5 -> 55.2 us, the op's 60.4 -> 51.5;
# the GPU machine's host ~2-3x slower): the module -60 to -120 us a call, the op -20 to -40.  ~2 minutes.
#   TWELL_SESSION=session41 TWELL_COMMIT=<sha> bash scripts/gpu_pending_host_ab.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session41}" hostab
stage host_ab_2048x5632 "$(left 240)" "A/B|Error" \
  python3 scripts/op_host_time.py --shape 2048x5632 --points 1024:28 16384:28 --ab 7
stage host_ab_1024x3072 "$(left 480)" "A/B|Error|skipped" \
  python3 scripts/op_host_time.py --shape 1024x3072 --points 4096:30 16384:30 --ab 7
call_end
