#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (CUDA backend; DSV4OPS_BACKEND=rocm on an AMD GPU): builds dsv4ops for
# the GPU into the current Python (torch must already be installed there), runs the GPU tests, the whole
# test suite against that torch, and the benchmarks. Logs and results go to LOG_DIR.
#
#   bash tools/run_gpu_checks.sh [LOG_DIR]          (default build/gpu-checks)
set -uo pipefail
cd "$(dirname "$0")/.."
LOG_DIR=$(mkdir -p "${1:-build/gpu-checks}" && cd "${1:-build/gpu-checks}" && pwd)
PY=${PYTHON:-python3}
export DSV4OPS_BACKEND=${DSV4OPS_BACKEND:-cuda}
export PYTHONUNBUFFERED=1
status=0
failed=()  # the steps that failed, named at the end

echo "== build (backend $DSV4OPS_BACKEND)"
if ! "$PY" -m pip install --no-build-isolation --no-deps -v . > "$LOG_DIR/build.log" 2>&1; then
  tail -60 "$LOG_DIR/build.log"
  exit 1
fi
"$PY" -m dsv4ops info 2>&1 | tee -a "$LOG_DIR/build.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || { status=1; failed+=("info"); }

if command -v compute-sanitizer > /dev/null; then
  echo "== memcheck"
  compute-sanitizer --tool memcheck --error-exitcode 1 "$PY" tools/sanitize_smoke.py 2>&1 | tee "$LOG_DIR/memcheck.log" | tail -3
  [ "${PIPESTATUS[0]}" -eq 0 ] || { status=1; failed+=("memcheck"); }
fi

echo "== GPU tests"
DSV4OPS_REQUIRE_GPU=1 "$PY" -m pytest -m gpu -q -rfEs --tb=line -p no:cacheprovider tests 2>&1 | tee "$LOG_DIR/pytest_gpu.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || { status=1; failed+=("GPU tests"); }

echo "== all tests"
"$PY" -m pytest -q -rfE --tb=line -p no:cacheprovider tests 2>&1 | tee "$LOG_DIR/pytest_all.log" | tail -15
[ "${PIPESTATUS[0]}" -eq 0 ] || { status=1; failed+=("all tests"); }

echo "== benchmarks"
for bench in bench/bench_*.py; do
  "$PY" "$bench" --out "$LOG_DIR" 2>&1 | tee "$LOG_DIR/$(basename "$bench" .py).log" | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || { status=1; failed+=("$(basename "$bench")"); }
done
if [ $status -ne 0 ]; then
  echo "== FAILED: ${failed[*]} (logs in $LOG_DIR)"
fi
exit $status
