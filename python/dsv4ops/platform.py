"""What a device is and what this build can run on it.

Every answer is taken from the device a tensor lives on, at call time (never from device 0, never at
import), and cached per device.

FP8 storage dtype on gfx942: caches written in FNUZ may live in tensors typed ``float8_e4m3fn`` (vLLM
allocates its caches that way). dsv4ops ops therefore take the encoding as an explicit ``fp8_format``
where a buffer's dtype does not say it; ``fp8_dtype(device)`` names the dtype that matches the device's
encoding.
"""

from __future__ import annotations

import enum
import functools

import torch

from ._ops import BUILD_INFO


class Fp8Format(enum.IntEnum):
    """FP8 e4m3 encodings. The values are the ``fp8_format`` ints of the op schemas."""

    OCP = 0  # e4m3fn: bias 7, max 448, NaN 0x7F/0xFF, has -0 (gfx950, NVIDIA)
    FNUZ = 1  # e4m3fnuz: bias 8, max 240, NaN 0x80 only, no -0 (gfx942)

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fnuz if self is Fp8Format.FNUZ else torch.float8_e4m3fn

    @property
    def max_finite(self) -> float:
        return 240.0 if self is Fp8Format.FNUZ else 448.0

    @property
    def default_quant_max(self) -> float:
        """The quantization bound: 448 for OCP; 224 for FNUZ (project policy, = 448/2; 240 is allowed)."""
        return 224.0 if self is Fp8Format.FNUZ else 448.0

    @classmethod
    def parse(cls, value) -> "Fp8Format":
        """Accepts an Fp8Format, its int, 'ocp'/'fn'/'fnuz', or the torch float8 e4m3 dtype."""
        if isinstance(value, cls):
            return value
        if isinstance(value, torch.dtype):
            if value == torch.float8_e4m3fn:
                return cls.OCP
            if value == torch.float8_e4m3fnuz:
                return cls.FNUZ
            raise ValueError(f"fp8_format: dtype {value} is not an FP8 e4m3 dtype")
        if isinstance(value, str):
            names = {"ocp": cls.OCP, "fn": cls.OCP, "e4m3fn": cls.OCP, "fnuz": cls.FNUZ, "e4m3fnuz": cls.FNUZ}
            if value.lower() in names:
                return names[value.lower()]
            raise ValueError(f"fp8_format: expected 'ocp' or 'fnuz', got {value!r}")
        if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
            return cls(value)
        raise ValueError(f"fp8_format: expected Fp8Format, 'ocp'/'fnuz', 0/1 or an e4m3 dtype, got {value!r}")


# Half of fp32's smallest subnormal 2^-149: it and every positive double below it round to fp32 zero (ties to even).
_LARGEST_DOUBLE_ROUNDING_TO_FP32_ZERO = 2.0**-150

# Chips whose FP8 hardware (conversions, MFMA) uses FNUZ. All other GPUs and the CPU default to OCP.
FNUZ_ARCHS = frozenset({"gfx940", "gfx941", "gfx942"})


def build_info() -> dict:
    """Facts about this build: version, backend, compiled GPU archs, FP8 encodings per arch."""
    return dict(BUILD_INFO)


def _device(device) -> torch.device:
    device = torch.device(device)
    if device.index is None and device.type == "cuda":  # the index first: reading .type makes a new string
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def fact_of_the_machine(function):
    """Memoizes `function` (hashable arguments) for the process, and makes a call under torch.compile a constant of
    the graph, computed once at trace time and not traced (Dynamo warns on, and does not trust, an lru_cache)."""
    values = {}

    @functools.wraps(function)
    def memoized(*args):
        if args not in values:
            values[args] = function(*args)
        return values[args]

    return torch.compiler.assume_constant_result(memoized)


@fact_of_the_machine
def _arch_of(device: torch.device) -> str:
    if device.type == "cpu":
        return "cpu"
    if device.type != "cuda":
        return device.type
    props = torch.cuda.get_device_properties(device.index)
    if torch.version.hip:
        return props.gcnArchName.split(":")[0]
    return f"sm_{props.major}{props.minor}"


def device_arch(device) -> str:
    """'cpu', 'gfx942', 'gfx950', 'sm_90', ... for a device (or anything torch.device accepts)."""
    return _arch_of(_device(device))


def fp8_format(device) -> Fp8Format:
    """The encoding the device's FP8 hardware uses: FNUZ on gfx942, OCP elsewhere (and on the CPU)."""
    return Fp8Format.FNUZ if device_arch(device) in FNUZ_ARCHS else Fp8Format.OCP


def quant_max(device) -> float:
    """The default quantization bound for the device's encoding: 224 on gfx942, 448 elsewhere."""
    return fp8_format(device).default_quant_max


_device_fp8_format = fp8_format  # format_and_quant_max has a parameter named fp8_format


def format_and_quant_max(device, fp8_format=None, quant_max=None, op: str = "dsv4ops"):
    """(Fp8Format, quant max) of a call: the given encoding or the device's, the given bound or that
    encoding's default (448 OCP, 224 FNUZ); refuses a bound outside (0, max finite]."""
    fmt = Fp8Format.parse(fp8_format) if fp8_format is not None else _device_fp8_format(device)
    qmax = float(quant_max) if quant_max is not None else fmt.default_quant_max
    # The kernels take it as fp32: a positive value that rounds to fp32 zero, (0, 2^-150], is refused too. (A
    # comparison, not a struct round trip, which torch.compile cannot trace once the value is symbolic.)
    if not (_LARGEST_DOUBLE_ROUNDING_TO_FP32_ZERO < qmax <= fmt.max_finite):
        raise ValueError(f"{op}: quant_max must be in (0, {fmt.max_finite}] for {fmt.name} (and positive in fp32), "
                         f"got {qmax}")
    return fmt, qmax


def fp8_dtype(device) -> torch.dtype:
    """The torch dtype that matches the device's FP8 encoding."""
    return fp8_format(device).torch_dtype


def built_arch_for(arch: str) -> str | None:
    """The compiled arch of this build that runs on `arch`, or None. 'sm_90a' code runs on sm_90 only."""
    if arch == "cpu":
        return "cpu"
    for built in BUILD_INFO["gpu_archs"]:
        if built == arch or (built.startswith("sm_") and built.rstrip("a") == arch):
            return built
    return None


def rebuild_command(arch: str) -> str:
    if arch.startswith("gfx"):
        return f"DSV4OPS_BACKEND=rocm DSV4OPS_GPU_ARCHS={arch} pip install --no-build-isolation ."
    if arch.startswith("sm_"):
        cc = arch[3:]
        suffix = "a" if cc in ("90", "100") else ""
        return f"DSV4OPS_BACKEND=cuda DSV4OPS_GPU_ARCHS={cc}{suffix} pip install --no-build-isolation ."
    return "pip install --no-build-isolation ."
