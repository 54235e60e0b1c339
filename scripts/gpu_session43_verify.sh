#!/usr/bin/env bash
# Session 43's check of the default eager floor in work (DispatchPolicy.eager_min_flops, f4e8c26): the GPU tests whose
# layer warms up eagerly below that floor (4096 tokens at 2048 x 5632, where the floor is 8192) and then chooses its hot
# set inside static_dispatch or by choose_hot_units (3f2c2fd) before a recorded or compiled call, the capability and
# overhead GPU tests, and the 1.5B model's eager forward under the new default against its tables without the floor
# (the probe first: with little device time left the call may end inside the tests).  Predicted: the tests pass; the
# default at >= 0.95x of dense at every token count (dense, ~1.0x, at 1024-4096 tokens where the tables alone read
# 0.58-0.59x on the H100 machine; 8192 and 16,384 tokens as before, 0.98x and 1.38x).  ~3-4 minutes.
#   TWELL_SESSION=session43 TWELL_COMMIT=<sha> bash scripts/gpu_session43_verify.sh
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session43}" verify
nvidia-smi --query-gpu=name --format=csv,noheader
stage eager_floor_probe_default "$(left 100)" "tokens=|eager floor|Error|error" \
  python3 scripts/eager_floor_probe.py --policies default tables --reps 9 --out "$R"
[ -f "$R/eager_floor_probe.json" ] && mv "$R/eager_floor_probe.json" "$R/eager_floor_probe_call${CALL}_$S.json"
stage pytest_gpu_floor "$(left 200)" "passed|failed|FAILED|Error" python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_nn_mlp_hot_cold.py tests/test_dispatch_capabilities.py tests/test_nn_overhead.py
call_end
