#!/usr/bin/env bash
# The next GPU call, prepared in session 35 (no machine was lent after session 34's first call); run it as
#   TWELL_SESSION=session36 TWELL_COMMIT=<sha> bash scripts/gpu_pending_call1.sh
# 1. The whole GPU suite: sessions 34-35's GPU tests (a recorded 2048x5632 call following the shipped decode table at
#    1 % and 50 % l0 estimates; GreedyDecoder's CUDA graph recorded by twell.generation.record_cuda_graph) have not run.
# 2. The untimed small calls at 2048x5632: `twell tune-dispatch` at 1, 2, 4, 8 and 16 tokens, eagerly, two runs on
#    their own draws.  Session 30 timed 1 and 16 tokens only (one token 1.13-1.18x at every density; 16 tokens won in
#    both runs at no density); since session 35 the calls between run dense (dispatch_tuning's rule between measured
#    counts).  Predicted: 2-4 tokens near one token's 1.13-1.18x at <= 1 %, since the op at one token is bound by its
#    launches, not its rows (ffn_sweep_session30.json, one token / 0.25 %: hot/cold 0.037 ms, dense 0.043 ms),
#    falling towards 16 tokens' 0.86-1.17x.  `twell tune-dispatch --from` these two runs and session 30's tiny runs
#    then gives the rows below 16.
. "$(dirname "$0")/gpu_call_lib.sh"
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session36}" 1
stage pytest_gpu_all "$(left 420)" "FAILED|passed|failed" python3 -m pytest -q -m gpu -p no:cacheprovider tests
for seed in 0 1; do
  stage "tune_2048_below16_s$seed" "$(left 560)" "<= M|DEFAULT_POLICY|WRONG|ERROR|Error" \
    python3 -m twell.cli tune-dispatch --shape 2048x5632 --ms 1 2 4 8 16 --seed "$seed" --out "$R" \
    --stem "dispatch_2048x5632_${S}_below16_s$seed"
done
call_end
