"""scikit-build-core metadata plugin: the package version with a local part that names the backend and
archs of the build, so wheels of different builds never collide:

    0.1.0+cpu    0.1.0+cu130.sm90a    0.1.0+rocm.gfx942.gfx950

It reads the same DSV4OPS_BACKEND / DSV4OPS_GPU_ARCHS the CMake build reads (cmake/Dsv4Backend.cmake
validates them and owns the defaults; this file only names them).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

BASE_VERSION = "0.1.0"
DEFAULT_ARCHS = {"cuda": ["90a"], "rocm": ["gfx942", "gfx950"]}


def _cuda_tag() -> str:
    nvcc = os.environ.get("CUDACXX") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "cu"
    match = re.search(r"release (\d+)\.(\d+)", out)
    return f"cu{match.group(1)}{match.group(2)}" if match else "cu"


def local_version(environ=os.environ) -> str:
    backend = environ.get("DSV4OPS_BACKEND", "").strip() or "cpu"
    if backend == "cpu":
        return "cpu"
    archs = [a for a in re.split(r"[;,]", environ.get("DSV4OPS_GPU_ARCHS", "")) if a.strip()]
    archs = [a.strip() for a in archs] or DEFAULT_ARCHS.get(backend, [])
    if backend == "cuda":
        return ".".join([_cuda_tag()] + [f"sm{a}" for a in archs])
    return ".".join([backend] + archs)


def dynamic_metadata(field, settings=None):
    if field != "version":
        raise ValueError("dsv4ops_version only provides 'version'")
    return f"{BASE_VERSION}+{local_version()}"
