#!/usr/bin/env bash
# The test suite of a CPU machine (what CI runs after `bash tools/setup.sh --dev`):
#   1. C++ numerics tests (gtest; the FP8 encoder on all 2^32 fp32 inputs unless DSV4OPS_EXHAUSTIVE=0), the
#      gfx942/gfx950/sm_90a kernel paths run on the CPU against the CPU kernels (tests/device_model), the
#      device-code checks: every kernel compiled for gfx942, gfx950 (clang) and sm_90a, sm_90, sm_89, sm_100a
#      (nvcc), FP8 convert instructions present, no scratch or spills -- all through CTest;
#   2. the kernels built for gfx942+gfx950 through CMake's HIP language, as on a ROCm machine;
#   3. pytest against the working tree, built and installed first (GPU tests skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
TC="$PWD/.toolchain"

echo "== build and install the working tree (CPU backend)"
python -m pip install -q --no-build-isolation --no-deps .

echo "== C++ tests and device-code checks"
cmake -S . -B build/ctest -G Ninja -DDSV4OPS_BUILD_PYTHON=OFF -DDSV4OPS_BUILD_TESTS=ON -DDSV4OPS_DEVICE_CHECK=ON \
  -DDSV4OPS_HIP_CLANG="$TC/clang20/bin/clang++" -DDSV4OPS_HIP_DEVICE_LIBS="$TC/devlibs" > /dev/null
cmake --build build/ctest
(cd build/ctest && DSV4OPS_EXHAUSTIVE="${DSV4OPS_EXHAUSTIVE:-1}" ctest -j2 --output-on-failure)

echo "== ROCm kernels through CMake's HIP language (gfx942;gfx950)"
cmake -S . -B build/rocm-kernels -G Ninja -DDSV4OPS_BACKEND=rocm -DDSV4OPS_BUILD_PYTHON=OFF \
  -DCMAKE_HIP_COMPILER="$TC/clang20/bin/clang++" -DCMAKE_HIP_FLAGS="--rocm-device-lib-path=$TC/devlibs" > /dev/null
cmake --build build/rocm-kernels

echo "== pytest"
python -m pytest -q tests
