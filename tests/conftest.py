"""Shared test setup. GPU variants of a test carry the `gpu` marker: they run with `pytest -m gpu` on a
machine with a GPU and a GPU build of dsv4ops, and are skipped elsewhere (set DSV4OPS_REQUIRE_GPU=1 to
make a missing GPU or GPU build an error instead of a skip)."""

import os

import pytest
import torch

import dsv4ops
from dsv4ops import Fp8Format, platform


def _gpu_skip_reason():
    if not torch.cuda.is_available():
        return "no CUDA/ROCm device"
    arch = platform.device_arch("cuda")
    if platform.built_arch_for(arch) is None:
        return f"this dsv4ops build has no kernel for {arch} (GPU archs: {platform.build_info()['gpu_archs']})"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _gpu_skip_reason()
    if reason is None:
        return
    if os.environ.get("DSV4OPS_REQUIRE_GPU") == "1":
        raise pytest.UsageError(f"DSV4OPS_REQUIRE_GPU=1 but GPU tests cannot run: {reason}")
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
FORMATS = [pytest.param(Fp8Format.OCP, id="ocp"), pytest.param(Fp8Format.FNUZ, id="fnuz")]


@pytest.fixture(autouse=True)
def _clean_dispatch_env(monkeypatch):
    monkeypatch.delenv("DSV4OPS_DISABLE", raising=False)
    monkeypatch.delenv("DSV4OPS_FORCE", raising=False)
    dsv4ops.dispatch.reset_fallbacks()
    dsv4ops.dispatch.forget_decisions()
    yield


def assert_bytes_equal(actual: torch.Tensor, expected: torch.Tensor):
    """Byte-exact comparison of 1-byte tensors, reporting the first mismatches."""
    a = actual.detach().cpu().contiguous().view(torch.uint8)
    e = expected.detach().cpu().contiguous().view(torch.uint8)
    assert a.shape == e.shape, f"shape {tuple(a.shape)} != {tuple(e.shape)}"
    diff = (a != e).nonzero()
    if diff.numel():
        first = [tuple(i.tolist()) for i in diff[:5]]
        details = ", ".join(f"{idx}: {int(a[idx])} != {int(e[idx])}" for idx in first)
        raise AssertionError(f"{diff.shape[0]} of {a.numel()} bytes differ; first: {details}")


def assert_bits_equal(actual: torch.Tensor, expected: torch.Tensor):
    """Exact comparison of floating tensors (NaN equals NaN, -0 differs from +0)."""
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}"
    a, e = actual.detach().cpu(), expected.detach().cpu()
    both_nan = torch.isnan(a) & torch.isnan(e)
    int_dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    same = (a.contiguous().view(int_dtype) == e.contiguous().view(int_dtype)) | both_nan
    if not bool(same.all()):
        bad = (~same).nonzero()[:5]
        details = ", ".join(f"{tuple(i.tolist())}: {a[tuple(i)].item()} != {e[tuple(i)].item()}" for i in bad)
        raise AssertionError(f"{int((~same).sum())} of {a.numel()} values differ; first: {details}")


def edge_values(fmt: Fp8Format) -> torch.Tensor:
    """+-0, NaN, +-Inf, +-max, subnormals, exact ties, and values landing on 224/240/448."""
    unit = 2.0 ** (-9 if fmt is Fp8Format.OCP else -10)
    values = [0.0, -0.0, float("nan"), float("inf"), float("-inf"), 448.0, -448.0, 240.0, -240.0, 224.0,
              -224.0, 464.0, 480.0, 248.0, 232.0, 1e30, -1e30, unit, -unit, unit / 2, unit * 1.5, unit * 2.5,
              unit * 7.5, unit / 3, -1e-30, 1.0625, 1.1875, -1.0625, 3.0, 0.1, 1.0, 2.0, 1e-45, -1e-45,
              float(torch.finfo(torch.float32).max), float(torch.finfo(torch.float32).tiny)]
    return torch.tensor(values, dtype=torch.float32)


def capture_graph(fn):
    """Runs fn once on a side stream (warm-up), then captures it into a CUDA graph on that stream.
    Returns (graph, what the captured call returned)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = fn()
    return graph, out
