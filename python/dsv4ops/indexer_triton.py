"""Triton fallback of the lightning-indexer logits (spec/indexer.md §3, §4): used on a GPU where Triton is
installed and this dsv4ops build has no kernel for the device (the way the upstream stack serves gfx942
today). Same contract as torch.ops.dsv4.fp8_mqa_logits / fp8_paged_mqa_logits and the reference.

Numerics. Each program scores a tile of keys: tl.dot of one query row's [H, D] FP8 tile against the
[D, BLOCK_N] key tile with fp32 accumulation, then x k_scale, ReLU and the weighted head sum; [M, H, N] is
never materialised. How an operand's bytes reach the matrix unit (operand modes, chosen on the host):
  * its encoding is the device's (OCP on NVIDIA sm_89+ and gfx950, FNUZ on gfx942): bitcast;
  * OCP bytes on gfx942: bitcast to FNUZ, which halves every finite value exactly, compensated by x2 on
    the scale (exact: a power of two, and ReLU is positive-homogeneous; spec §3.5 rule 2);
  * FNUZ bytes on an OCP device (or any operand on a device without a known FP8 matrix unit): both operands
    are decoded exactly to fp16 with integer ops and the dot runs in fp16 (an OCP/FNUZ value times 2^-8 /
    2^-7 has the same bits as the code shifted into an fp16, and every FP8 e4m3 value is an fp16).
Byte 0x80 reads as +0 in every mode (spec §3.5 rule 4). NaN codes are outside the contract (finite inputs):
an OCP 0x7F/0xFF bitcast to FNUZ reads as +-480 where the reference gives NaN.
On sm_90 the FP8 wgmma partial sums are promoted to the fp32 accumulator every 32 products
(max_num_imprecise_acc=32, like an m16n8k32 mma.sync chain) instead of Triton's default of never.

Triton is imported lazily: this module imports without it, and available() says whether it can run. Inside a
torch.compile graph the launches are the custom ops dsv4_triton::fp8_mqa_logits / fp8_paged_mqa_logits (end of file).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Optional

import torch

from . import platform
from .reference.indexer import uint8_scales_as_fp32

# Operand modes (the kernel's Q_MODE / K_MODE constexprs).
MODE_OCP = 0  # bitcast to tl.float8e4nv
MODE_FNUZ = 1  # bitcast to tl.float8e4b8
MODE_F16_FROM_OCP = 2  # decode OCP bytes to fp16
MODE_F16_FROM_FNUZ = 3  # decode FNUZ bytes to fp16

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


@platform.fact_of_the_machine
def available() -> bool:
    """Whether triton imports here (its GPU backends are checked only when a kernel is launched)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means the fallback is not available
        return False
    return True


def _is_fnuz(dtype: torch.dtype) -> bool:
    if dtype == torch.float8_e4m3fnuz:
        return True
    if dtype == torch.float8_e4m3fn:
        return False
    raise ValueError(f"expected float8_e4m3fn or float8_e4m3fnuz (decoded per its dtype), got {dtype}")


def native_format(arch: str) -> Optional[str]:
    """'ocp' / 'fnuz' when the arch's matrix unit takes that FP8 encoding (as Triton exposes it), else None."""
    if arch.startswith("gfx942"):
        return "fnuz"
    if arch.startswith("gfx950"):
        return "ocp"
    if arch.startswith("sm_"):
        digits = "".join(ch for ch in arch[3:] if ch.isdigit())
        if digits and int(digits) >= 89:
            return "ocp"
    return None


def operand_modes(q_fnuz: bool, k_fnuz: bool, arch: str):
    """(q mode, k mode, scale multiplier) for operands of these encodings on this arch."""
    native = native_format(arch)
    if native == "fnuz":
        # OCP bytes read as FNUZ are exactly half their value: one x2 per converted operand.
        multiplier = (1.0 if q_fnuz else 2.0) * (1.0 if k_fnuz else 2.0)
        return MODE_FNUZ, MODE_FNUZ, multiplier
    if native == "ocp" and not q_fnuz and not k_fnuz:
        return MODE_OCP, MODE_OCP, 1.0
    f16 = lambda fnuz: MODE_F16_FROM_FNUZ if fnuz else MODE_F16_FROM_OCP  # noqa: E731
    return f16(q_fnuz), f16(k_fnuz), 1.0


@functools.lru_cache(maxsize=None)
def kernels():
    """(prefill kernel, paged decode kernel), defined on first use."""
    import triton
    import triton.language as tl

    @triton.jit
    def _operand(codes, MODE: tl.constexpr):
        """uint8 codes -> the dot operand (0x80 reads as +0)."""
        codes = tl.where(codes == 0x80, tl.zeros_like(codes), codes)
        if MODE == 0:
            return codes.to(tl.float8e4nv, bitcast=True)
        elif MODE == 1:
            return codes.to(tl.float8e4b8, bitcast=True)
        else:
            wide = codes.to(tl.uint16)
            bits = (((wide & 0x80) << 8) | ((wide & 0x7F) << 7)).to(tl.uint16)
            value = bits.to(tl.float16, bitcast=True).to(tl.float32)
            if MODE == 2:
                return (value * 256.0).to(tl.float16)
            else:
                return (value * 128.0).to(tl.float16)

    # The interpreter (TRITON_INTERPRET=1) resolves a kernel's names in its module's globals only, and
    # patches triton.language for the kernel only when it finds the module there.
    globals().update(tl=tl, _operand=_operand)

    @triton.jit
    def mqa_logits_kernel(q_ptr, k_ptr, k_scale_ptr, w_ptr, ks_ptr, ke_ptr, out_ptr,
                          M, N, H, D, stride_qm, stride_qh, stride_kn, stride_om, scale_multiplier,
                          Q_MODE: tl.constexpr, K_MODE: tl.constexpr, CLEAN: tl.constexpr,
                          BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                          ROWS: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        tile_lo = pid_n * BLOCK_N
        offs_n = tile_lo + tl.arange(0, BLOCK_N)
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        n_ok = offs_n < N
        d_ok = offs_d < D
        h_ok = offs_h < H
        k_codes = tl.load(k_ptr + offs_n.to(tl.int64)[:, None] * stride_kn + offs_d[None, :],
                          mask=n_ok[:, None] & d_ok[None, :], other=0)
        k_tile = tl.trans(_operand(k_codes, K_MODE))
        k_scale = tl.load(k_scale_ptr + offs_n, mask=n_ok, other=0.0) * scale_multiplier
        minus_inf = tl.full([BLOCK_N], float("-inf"), tl.float32)
        for i in range(ROWS):
            m = pid_m * ROWS + i
            if m < M:
                start = tl.minimum(tl.maximum(tl.load(ks_ptr + m), 0), N)
                end = tl.minimum(tl.maximum(tl.load(ke_ptr + m), start), N)
                out_row = out_ptr + m.to(tl.int64) * stride_om + offs_n
                if (start < tile_lo + BLOCK_N) & (end > tile_lo) & (end > start):
                    q_codes = tl.load(q_ptr + m.to(tl.int64) * stride_qm + offs_h[:, None] * stride_qh
                                      + offs_d[None, :], mask=h_ok[:, None] & d_ok[None, :], other=0)
                    scores = tl.dot(_operand(q_codes, Q_MODE), k_tile, max_num_imprecise_acc=32)  # [BLOCK_H, BLOCK_N] fp32
                    scores = tl.maximum(scores * k_scale[None, :], 0.0)
                    w = tl.load(w_ptr + m.to(tl.int64) * H + offs_h, mask=h_ok, other=0.0)
                    logits = tl.sum(scores * w[:, None], axis=0)
                    inside = (offs_n >= start) & (offs_n < end)
                    if CLEAN:
                        tl.store(out_row, tl.where(inside, logits, minus_inf), mask=n_ok)
                    else:
                        tl.store(out_row, logits, mask=n_ok & inside)
                elif CLEAN:
                    tl.store(out_row, minus_inf, mask=n_ok)

    @triton.jit
    def paged_mqa_logits_kernel(q_ptr, cache_ptr, w_ptr, lens_ptr, table_ptr, out_ptr,
                                num_blocks, block_size, block_stride, table_stride, table_cols, max_model_len,
                                H, D, scale_multiplier, NEXT_N: tl.constexpr,
                                LENS_PER_ROW: tl.constexpr, Q_MODE: tl.constexpr, K_MODE: tl.constexpr,
                                CLEAN: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                                BLOCK_N: tl.constexpr):
        pid_t = tl.program_id(0)
        b = tl.program_id(1)
        tile_lo = pid_t * BLOCK_N
        offs_t = tile_lo + tl.arange(0, BLOCK_N)
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        h_ok = offs_h < H
        t_ok = offs_t < max_model_len
        minus_inf = tl.full([BLOCK_N], float("-inf"), tl.float32)
        # The longest visible length over this request's rows bounds the cache reads.
        longest = tl.full([], 0, tl.int32)
        for n in range(NEXT_N):
            if LENS_PER_ROW:
                length = tl.load(lens_ptr + b * NEXT_N + n)
            else:
                length = tl.load(lens_ptr + b) - NEXT_N + n + 1
            longest = tl.maximum(longest, tl.minimum(tl.maximum(length, 0), max_model_len))
        if tile_lo < longest:
            column = offs_t // block_size
            entry = offs_t - column * block_size
            wanted = t_ok & (offs_t < longest) & (column < table_cols)
            block = tl.load(table_ptr + b.to(tl.int64) * table_stride + column, mask=wanted, other=-1)
            readable = wanted & (block >= 0) & (block < num_blocks)
            base = cache_ptr + tl.where(readable, block, 0).to(tl.int64) * block_stride
            k_codes = tl.load(base[:, None] + (entry * D)[:, None] + offs_d[None, :],
                              mask=readable[:, None] & d_ok[None, :], other=0)
            k_tile = tl.trans(_operand(k_codes, K_MODE))
            scale_ptr = (base + block_size * D + entry * 4).to(tl.pointer_type(tl.float32), bitcast=True)
            k_scale = tl.load(scale_ptr, mask=readable, other=0.0) * scale_multiplier
            for n in range(NEXT_N):
                r = b * NEXT_N + n
                if LENS_PER_ROW:
                    length = tl.load(lens_ptr + r)
                else:
                    length = tl.load(lens_ptr + b) - NEXT_N + n + 1
                length = tl.minimum(tl.maximum(length, 0), max_model_len)
                out_row = out_ptr + r.to(tl.int64) * max_model_len + offs_t
                q_codes = tl.load(q_ptr + r.to(tl.int64) * H * D + offs_h[:, None] * D + offs_d[None, :],
                                  mask=h_ok[:, None] & d_ok[None, :], other=0)
                scores = tl.dot(_operand(q_codes, Q_MODE), k_tile, max_num_imprecise_acc=32)
                scores = tl.maximum(scores * k_scale[None, :], 0.0)
                w = tl.load(w_ptr + r.to(tl.int64) * H + offs_h, mask=h_ok, other=0.0)
                logits = tl.where(readable, tl.sum(scores * w[:, None], axis=0), minus_inf)
                visible = offs_t < length
                if CLEAN:
                    tl.store(out_row, tl.where(visible, logits, minus_inf), mask=t_ok)
                else:
                    tl.store(out_row, logits, mask=t_ok & visible)
        elif CLEAN:
            for n in range(NEXT_N):
                r = b * NEXT_N + n
                tl.store(out_ptr + r.to(tl.int64) * max_model_len + offs_t, minus_inf, mask=t_ok)

    return mqa_logits_kernel, paged_mqa_logits_kernel


def _on(device: torch.device):
    # The interpreter (TRITON_INTERPRET=1, used by the CPU tests) runs on CPU tensors.
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _pow2(x: int, floor: int) -> int:
    return max(floor, 1 << max(0, int(x) - 1).bit_length())


def block_sizes(heads: int, dim: int):
    """(BLOCK_H, BLOCK_D) covering H and D (matrix-unit minimums: 16 rows, 32 reduction)."""
    return _pow2(heads, 16), _pow2(dim, 32)


BLOCK_N = 64
ROWS_PER_PROGRAM = 16
NUM_WARPS = 4


def _k_scale(k_scale: torch.Tensor, n: int) -> torch.Tensor:
    if k_scale.dtype == torch.uint8:
        if k_scale.dim() != 2 or tuple(k_scale.shape) != (n, 4):
            raise ValueError(f"fp8_mqa_logits: a uint8 k_scale must be [N, 4] (one fp32 per row), got "
                             f"{tuple(k_scale.shape)}")
        return uint8_scales_as_fp32(k_scale)
    if k_scale.dtype != torch.float32 or k_scale.numel() != n:
        raise ValueError(f"fp8_mqa_logits: k_scale must be [N] or [N, 1] fp32 (N = {n}), got "
                         f"{tuple(k_scale.shape)} {k_scale.dtype}")
    return k_scale.reshape(-1).contiguous()


def fp8_mqa_logits(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
                   ks: torch.Tensor, ke: torch.Tensor, clean_logits: bool = True) -> torch.Tensor:
    """spec §3.2 on a GPU through Triton; columns outside [ks, ke) are -inf when clean_logits, else unwritten."""
    if torch.compiler.is_compiling():  # detached: the logits carry no gradient, as in eager calls
        return torch.ops.dsv4_triton.fp8_mqa_logits(*(t.detach() for t in (q, k, k_scale, weights, ks, ke)),
                                                    bool(clean_logits))
    return _launch_mqa_logits(q, k, k_scale, weights, ks, ke, clean_logits)


def _launch_mqa_logits(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
                       ks: torch.Tensor, ke: torch.Tensor, clean_logits: bool) -> torch.Tensor:
    q_fnuz, k_fnuz = _is_fnuz(q.dtype), _is_fnuz(k.dtype)
    if q.dim() != 3 or k.dim() != 2 or k.shape[1] != q.shape[2]:
        raise ValueError(f"fp8_mqa_logits: q must be [M, H, D] and k [N, D], got {tuple(q.shape)}, {tuple(k.shape)}")
    m, heads, dim = q.shape
    n = k.shape[0]
    if tuple(weights.shape) != (m, heads) or weights.dtype != torch.float32:
        raise ValueError(f"fp8_mqa_logits: weights must be [{m}, {heads}] fp32, got {tuple(weights.shape)} "
                         f"{weights.dtype}")
    for name, t in (("cu_seqlen_ks", ks), ("cu_seqlen_ke", ke)):
        if t.dtype != torch.int32 or tuple(t.shape) != (m,):
            raise ValueError(f"fp8_mqa_logits: {name} must be int32 [{m}], got {tuple(t.shape)} {t.dtype}")
    scale = _k_scale(k_scale, n)
    logits = torch.empty(m, n, dtype=torch.float32, device=q.device)
    if m == 0 or n == 0:
        return logits
    q = q if q.stride(2) == 1 else q.contiguous()
    k = k if k.stride(1) == 1 else k.contiguous()
    q_mode, k_mode, multiplier = operand_modes(q_fnuz, k_fnuz, platform.device_arch(q.device))
    block_h, block_d = block_sizes(heads, dim)
    kernel, _ = kernels()
    grid = (-(-n // BLOCK_N), -(-m // ROWS_PER_PROGRAM))
    with _on(q.device):
        kernel[grid](q.view(torch.uint8), k.view(torch.uint8), scale, weights.contiguous(), ks.contiguous(),
                     ke.contiguous(), logits, m, n, heads, dim, q.stride(0), q.stride(1), k.stride(0), logits.stride(0),
                     multiplier, Q_MODE=q_mode, K_MODE=k_mode, CLEAN=bool(clean_logits), BLOCK_H=block_h,
                     BLOCK_D=block_d, BLOCK_N=BLOCK_N, ROWS=ROWS_PER_PROGRAM, num_warps=NUM_WARPS)
    return logits


def paged_cache_unsupported(q: torch.Tensor, kv_cache: torch.Tensor) -> Optional[str]:
    """Why the Triton kernel cannot read this cache (None: it can): it loads each block's fp32 scales, which
    follow block_size x D FP8 bytes, 4 bytes at a time, so block_size x D must be a multiple of 4."""
    if q.dim() != 4 or kv_cache.dim() < 2 or kv_cache.shape[0] == 0:
        return None
    dim, block_bytes = q.shape[-1], kv_cache[0].numel()
    if block_bytes % (dim + 4) == 0 and (block_bytes // (dim + 4) * dim) % 4:
        return (f"the Triton kernel reads a block's fp32 scales 4-byte aligned, and block_size x D = "
                f"{block_bytes // (dim + 4)} x {dim} is not a multiple of 4")
    return None


def fp8_paged_mqa_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                         block_tables: torch.Tensor, max_model_len: int, clean_logits: bool = True,
                         kv_dtype: torch.dtype = None) -> torch.Tensor:
    """spec §4 on a GPU through Triton: q [B, next_n, H, D] FP8, the block-flat uint8 cache whose FP8 bytes
    are read as kv_dtype (default: q's) -> logits [B * next_n, max_model_len] fp32."""
    kv_dtype = kv_dtype if kv_dtype is not None else q.dtype
    if torch.compiler.is_compiling():  # detached: the logits carry no gradient, as in eager calls
        return torch.ops.dsv4_triton.fp8_paged_mqa_logits(
            *(t.detach() for t in (q, kv_cache, weights, context_lens, block_tables)), int(max_model_len),
            bool(clean_logits), kv_dtype)
    return _launch_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, max_model_len, clean_logits,
                                    kv_dtype)


def _launch_paged_mqa_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                             context_lens: torch.Tensor, block_tables: torch.Tensor, max_model_len: int,
                             clean_logits: bool, kv_dtype: torch.dtype) -> torch.Tensor:
    q_fnuz, k_fnuz = _is_fnuz(q.dtype), _is_fnuz(kv_dtype)
    if q.dim() != 4:
        raise ValueError(f"fp8_paged_mqa_logits: q must be [B, next_n, H, D], got {tuple(q.shape)}")
    batch, next_n, heads, dim = q.shape
    rows = batch * next_n
    max_model_len = int(max_model_len)
    if kv_cache.dtype != torch.uint8 or kv_cache.dim() < 2:
        raise ValueError(f"fp8_paged_mqa_logits: kv_cache must be uint8 [num_blocks, ...], got "
                         f"{tuple(kv_cache.shape)} {kv_cache.dtype}")
    num_blocks = kv_cache.shape[0]
    block_bytes = kv_cache[0].numel() if num_blocks else kv_cache.shape[1:].numel()
    if block_bytes == 0 or block_bytes % (dim + 4):
        raise ValueError(f"fp8_paged_mqa_logits: a block of {block_bytes} bytes is not a whole number of "
                         f"{dim + 4}-byte entries")
    block_size = block_bytes // (dim + 4)
    if tuple(weights.shape) != (rows, heads) or weights.dtype != torch.float32:
        raise ValueError(f"fp8_paged_mqa_logits: weights must be [{rows}, {heads}] fp32, got {tuple(weights.shape)}")
    per_row = context_lens.dim() == 2 and context_lens.shape[1] == next_n and next_n > 1
    if context_lens.dtype != torch.int32 or context_lens.shape[0] != batch or not (
            context_lens.dim() == 1 or (context_lens.dim() == 2 and (context_lens.shape[1] == 1 or per_row))):
        raise ValueError(f"fp8_paged_mqa_logits: context_lens must be int32 [{batch}], [{batch}, 1] or "
                         f"[{batch}, {next_n}], got {tuple(context_lens.shape)} {context_lens.dtype}")
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2 or block_tables.shape[0] != batch:
        raise ValueError(f"fp8_paged_mqa_logits: block_tables must be int32 [{batch}, max_blocks], got "
                         f"{tuple(block_tables.shape)} {block_tables.dtype}")
    if max_model_len < 0:
        raise ValueError(f"fp8_paged_mqa_logits: max_model_len must be >= 0, got {max_model_len}")
    logits = torch.empty(rows, max_model_len, dtype=torch.float32, device=q.device)
    if rows == 0 or max_model_len == 0:
        return logits
    cache = kv_cache.reshape(num_blocks, block_bytes) if num_blocks else torch.zeros(1, block_bytes, dtype=torch.uint8,
                                                                                   device=q.device)
    unsupported = paged_cache_unsupported(q, kv_cache)
    if unsupported is not None:
        raise ValueError(f"fp8_paged_mqa_logits: {unsupported}")
    if cache.stride(1) != 1 or cache.stride(0) % 4 or cache.data_ptr() % 4:
        cache = cache.contiguous()  # the fp32 scales are read 4-byte aligned
    table = block_tables if block_tables.shape[1] <= 1 or block_tables.stride(1) == 1 else block_tables.contiguous()
    table_arg = table if table.numel() else torch.full((batch, 1), -1, dtype=torch.int32, device=q.device)
    q_mode, k_mode, multiplier = operand_modes(q_fnuz, k_fnuz, platform.device_arch(q.device))
    block_h, block_d = block_sizes(heads, dim)
    _, kernel = kernels()
    grid = (-(-max_model_len // BLOCK_N), batch)
    with _on(q.device):
        kernel[grid](q.contiguous().view(torch.uint8), cache, weights.contiguous(), context_lens.contiguous(),
                     table_arg, logits, num_blocks, block_size, cache.stride(0), table_arg.stride(0), table.shape[1],
                     max_model_len, heads, dim, multiplier, NEXT_N=next_n, LENS_PER_ROW=per_row, Q_MODE=q_mode,
                     K_MODE=k_mode, CLEAN=bool(clean_logits), BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_N=BLOCK_N,
                     num_warps=NUM_WARPS)
    return logits


# Under torch.compile the launches are opaque ops: Dynamo cannot trace triton's import, the @triton.jit
# definitions of kernels() or the launch-side checks, so a compiled graph calls these, which launch eagerly
# (_launch_* looked up at call time). Eager calls launch directly, without the op dispatch's overhead.
@torch.library.custom_op("dsv4_triton::fp8_mqa_logits", mutates_args=())
def _mqa_logits_op(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
                   ks: torch.Tensor, ke: torch.Tensor, clean_logits: bool) -> torch.Tensor:
    return _launch_mqa_logits(q, k, k_scale, weights, ks, ke, clean_logits)


@_mqa_logits_op.register_fake
def _(q, k, k_scale, weights, ks, ke, clean_logits):
    return q.new_empty((q.shape[0], k.shape[0]), dtype=torch.float32)


@torch.library.custom_op("dsv4_triton::fp8_paged_mqa_logits", mutates_args=())
def _paged_mqa_logits_op(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                         block_tables: torch.Tensor, max_model_len: int, clean_logits: bool,
                         kv_dtype: torch.dtype) -> torch.Tensor:
    return _launch_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, max_model_len, clean_logits,
                                    kv_dtype)


@_paged_mqa_logits_op.register_fake
def _(q, kv_cache, weights, context_lens, block_tables, max_model_len, clean_logits, kv_dtype):
    torch._check(max_model_len >= 0, lambda: f"fp8_paged_mqa_logits: max_model_len must be >= 0, got {max_model_len}")
    return q.new_empty((q.shape[0] * q.shape[1], max_model_len), dtype=torch.float32)
