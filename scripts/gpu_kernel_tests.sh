#!/usr/bin/env bash
# The tests that take the `device` fixture (marked `kernel` by tests/conftest.py: 1157 of 2306 in session 49), natively
# on the GPU.  Until session 49 the GPU suite ran `-m gpu` (200 tests) and none of these ran on a GPU: they passed in
# CI's interpreter only.  The first two files run on an H100 in session 49 found 9 bit tests failing (the dense-row
# pass's gated product kept relu(-0.0) = -0.0 where CUDA's torch.relu gives +0.0; fixed in eb3b775).  On the CPU they
# take most of CI's ~16-20 minutes, kernel builds dominating there too, so the files go to GROUPS pytest processes
# at once (16 CPU cores on the device machines; the kernels they launch are small), each with its own log; the call
# prints each group's summary line and every failure.
#   TWELL_SESSION=session50 TWELL_COMMIT=<sha> bash scripts/gpu_kernel_tests.sh            # all kernel tests
#   FILES="tests/test_ops_decode.py tests/test_ops_hot_cold.py" ... bash scripts/gpu_kernel_tests.sh   # some files
# Session 50 (H200, 8 groups): 1156 passed, 1 failed (a torch-reference test's index_add_ atomics, since fixed), the
# longest group 273.72 s.  MARK=gpu runs the `-m gpu` set (200 tests, 252-351 s in one process) the same way; its
# tests time nothing against a threshold, but some hold several GB of GPU memory, so keep its GROUPS_N at 3-4.
#   MARK=gpu GROUPS_N=3 TWELL_SESSION=session51 TWELL_COMMIT=<sha> bash scripts/gpu_kernel_tests.sh
. "$(dirname "$0")/gpu_call_lib.sh"
mark=${MARK:-kernel}
case $mark in kernel|gpu) ;; *) echo "MARK must be kernel or gpu, got '$mark'" >&2; exit 2;; esac
call_begin "${TWELL_SESSION:?set TWELL_SESSION, e.g. session50}" "${mark}s"
nvidia-smi --query-gpu=name --format=csv,noheader
groups=${GROUPS_N:-4}
limit=$(left "${TOTAL:-560}")
if [ -n "${FILES:-}" ]; then
  read -r -a files <<< "$FILES"
else  # the files with at least one kernel test, largest first so that the groups even out
  mapfile -t files < <(python3 -m pytest tests -q -p no:cacheprovider --collect-only -m "$mark" 2>/dev/null |
    grep "::" | cut -d: -f1 | sort | uniq -c | sort -rn | awk '{print $2}')
fi
echo "${#files[@]} files, $groups groups, ${limit}s"
pids=()
for g in $(seq 0 $((groups - 1))); do
  mine=()
  for i in "${!files[@]}"; do
    if [ $((i % groups)) -eq "$g" ]; then mine+=("${files[$i]}"); fi
  done
  [ ${#mine[@]} -eq 0 ] && continue
  # -v: each test's outcome is in the log as it ends, so that a group cut by the limit still says what failed
  timeout "$limit" python3 -m pytest -v --tb=short -p no:cacheprovider -m "$mark" "${mine[@]}" \
    > "$R/pytest_gpu_${mark}_g${g}_call${CALL}_$S.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
for log in "$R"/pytest_gpu_"${mark}"_g*_call"${CALL}"_"$S".log; do
  echo "$(basename "$log"): $(grep -cE " PASSED" "$log") passed, $(grep -cE " (FAILED|ERROR)" "$log") failed or" \
    "errors, $(grep -cE "::.* SKIPPED" "$log") skipped so far; last line: $(grep -E "passed|failed|error|skipped" "$log" |
    tail -n 1)"
  grep -E "^(FAILED|ERROR)|::.* (FAILED|ERROR)" "$log" | cut -c1-300 | head -n 60
done
call_end
