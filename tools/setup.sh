#!/usr/bin/env bash
# Sets up a development environment for dsv4ops on a Debian/Ubuntu x86-64 machine and installs the
# package (CPU backend unless DSV4OPS_BACKEND says otherwise) into ./.venv.
#
#   bash tools/setup.sh          # venv + torch + build tools + dsv4ops
#   bash tools/setup.sh --dev    # also gtest and the AMDGPU/CUDA device-compile toolchain used by the tests
#
# Torch is pinned (DSV4OPS_TORCH_SPEC, default torch==2.13.0) and installed before the package: the build never
# resolves torch itself (build isolation would pull a multi-GB CUDA build). pip takes the CPU build where its
# configuration offers one (a local wheel, or PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu).
set -euo pipefail
cd "$(dirname "$0")/.."

DEV=0
for arg in "$@"; do
  case "$arg" in
    --dev) DEV=1 ;;
    *) echo "usage: tools/setup.sh [--dev]" >&2; exit 2 ;;
  esac
done

PY=${PYTHON:-python3}
TORCH_SPEC=${DSV4OPS_TORCH_SPEC:-torch==2.13.0}

apt_install() {
  local missing=()
  for pkg in "$@"; do dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then echo "setup: please install: ${missing[*]}" >&2; exit 1; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

if [ "$DEV" = 1 ]; then
  # clang-19 + Debian HIP headers/device libs compile gfx942 device code; clang-tools-19 holds the offload
  # bundler; libclang-rt-19-dev is needed by CMake's HIP language support; libgtest-dev for the C++ tests.
  apt_install clang-19 lld-19 llvm-19 libamdhip64-dev rocm-device-libs clang-tools-19 libclang-rt-19-dev libgtest-dev
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
python -m pip install -q "$TORCH_SPEC"
python -m pip install -q "scikit-build-core>=0.10" "pybind11>=2.13" ninja "cmake>=3.31,<5" numpy pytest
if [ "$DEV" = 1 ]; then
  python -m pip install -q ziglang==0.15.2 expecttest
  python -m pip install -q --no-deps triton==3.6.0  # the indexer's Triton fallback (compiled for gfx942/gfx950/sm_90 in the tests); --no-deps keeps torch
  PY=python bash tools/setup_amdgpu_toolchain.sh "$PWD/.toolchain"
fi

python -m pip install -q --no-build-isolation --no-deps .
echo "setup: dsv4ops installed into $PWD/.venv"
