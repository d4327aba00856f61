"""Loads the compiled extension. Its shared object registers every torch.ops.dsv4.* schema and the CPU
(and, in GPU builds, CUDA/HIP) kernels through the LibTorch stable ABI."""

from . import _C  # noqa: F401

BUILD_INFO = _C.build_info()
