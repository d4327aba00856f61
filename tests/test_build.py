"""Build facts, the wheel's local version, configure-time arch validation and the info command."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import dsv4ops

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "build"))
import dsv4ops_version  # noqa: E402


def test_build_info_is_consistent_with_version():
    info = dsv4ops.build_info()
    assert info["backend"] in ("cpu", "cuda", "rocm")
    assert info["version"] == dsv4ops.__version__
    local = dsv4ops.__version__.split("+")[1]
    if info["backend"] == "cpu":
        assert local == "cpu" and info["gpu_archs"] == []
    else:
        assert info["gpu_archs"], "a GPU build must name its archs"
        for arch in info["gpu_archs"]:
            assert arch.replace("_", "") in local
    assert set(info["fp8_encodings"]) == {"cpu", *info["gpu_archs"]}
    assert info["torch_stable_abi_target"] == "2.10"


@pytest.mark.parametrize(
    "env,expected",
    [({}, "cpu"), ({"DSV4OPS_BACKEND": "rocm"}, "rocm.gfx942.gfx950"),
     ({"DSV4OPS_BACKEND": "rocm", "DSV4OPS_GPU_ARCHS": "gfx950"}, "rocm.gfx950"),
     ({"DSV4OPS_BACKEND": "cuda", "DSV4OPS_GPU_ARCHS": "90a"}, ".sm90a")],
)
def test_wheel_local_version(env, expected):
    local = dsv4ops_version.local_version(env)
    assert local.endswith(expected) and (env.get("DSV4OPS_BACKEND") != "cuda" or local.startswith("cu"))


def _configure(tmp_path, **defs):
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake not on PATH")
    args = [cmake, "-S", str(ROOT), "-B", str(tmp_path / "b"), "-DDSV4OPS_BUILD_PYTHON=OFF"]
    args += [f"-D{k}={v}" for k, v in defs.items()]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV4OPS_")}
    return subprocess.run(args, capture_output=True, text=True, env=env)


@pytest.mark.parametrize(
    "defs,message",
    [({"DSV4OPS_BACKEND": "cuda", "DSV4OPS_GPU_ARCHS": "75"}, "'75' is not a known cuda arch; allowed: 90a;90;89;100a"),
     ({"DSV4OPS_BACKEND": "rocm", "DSV4OPS_GPU_ARCHS": "gfx942;gfx90a"}, "'gfx90a' is not a known rocm arch; allowed: gfx942;gfx950"),
     ({"DSV4OPS_BACKEND": "metal"}, "is not one of: cpu;cuda;rocm"),
     ({"DSV4OPS_GPU_ARCHS": "gfx942"}, "was given but DSV4OPS_BACKEND is cpu")],
)
def test_configure_rejects_unknown_archs(tmp_path, defs, message):
    result = _configure(tmp_path, **defs)
    assert result.returncode != 0
    assert message in " ".join((result.stdout + result.stderr).split())


def test_info_command():
    result = subprocess.run([sys.executable, "-m", "dsv4ops", "info"], capture_output=True, text=True, check=True)
    assert "backend:" in result.stdout and "fp8_block_dequantize" in result.stdout
    assert "device cpu: arch cpu, FP8 OCP" in result.stdout
