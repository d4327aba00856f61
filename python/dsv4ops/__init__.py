"""dsv4ops: DeepSeek-V4 attention-path kernels as torch.ops.dsv4.*, for AMD Instinct (gfx942 FNUZ,
gfx950 OCP), NVIDIA sm_90a and the CPU.

Importing the package loads the compiled ops (torch must be imported first: the extension links
libtorch through torch's own folder) and registers their fake implementations for torch.compile.
"""

import torch  # noqa: F401  (must precede the extension)

from . import _ops  # noqa: F401  (loads dsv4ops._C, registers torch.ops.dsv4.*)
from . import _fake  # noqa: F401
from ._version import __version__
from .dispatch import explain, fallback_counts
from .fp8 import (
    e4m3fn_to_fnuz,
    float_to_ue8m0_lossless,
    fp8_block_dequantize,
    fp8_encode,
    ue8m0_to_float,
)
from .kv_cache import (
    dequantize_and_gather_k_cache,
    kv_norm_rope_quant_insert,
    kv_rope_quant_insert,
    qnorm_rope_kv_insert,
    qnorm_rope_kv_insert_full_cache_bf16,
    qnorm_rope_kv_insert_full_cache_fp8,
    quantize_and_insert_k_cache,
)
from .mhc import hc_head, mhc_fused_post_pre, mhc_post, mhc_pre
from .indexer import fp8_mqa_logits, fp8_paged_mqa_logits, topk_per_row_decode, topk_per_row_prefill
from .sparse_mla import sparse_mla_decode
from .wo_a import bmm_a8w8_mxscale, inverse_rope, inverse_rope_group_quant, prepare_wo_a, wo_a_forward
from .platform import Fp8Format, build_info, device_arch, fp8_dtype, fp8_format, quant_max

__all__ = [
    "__version__",
    "Fp8Format",
    "bmm_a8w8_mxscale",
    "build_info",
    "dequantize_and_gather_k_cache",
    "device_arch",
    "e4m3fn_to_fnuz",
    "explain",
    "fallback_counts",
    "float_to_ue8m0_lossless",
    "fp8_block_dequantize",
    "fp8_dtype",
    "fp8_encode",
    "fp8_format",
    "fp8_mqa_logits",
    "fp8_paged_mqa_logits",
    "hc_head",
    "inverse_rope",
    "inverse_rope_group_quant",
    "kv_norm_rope_quant_insert",
    "kv_rope_quant_insert",
    "mhc_fused_post_pre",
    "mhc_post",
    "mhc_pre",
    "prepare_wo_a",
    "qnorm_rope_kv_insert",
    "qnorm_rope_kv_insert_full_cache_bf16",
    "qnorm_rope_kv_insert_full_cache_fp8",
    "quant_max",
    "quantize_and_insert_k_cache",
    "sparse_mla_decode",
    "topk_per_row_decode",
    "topk_per_row_prefill",
    "ue8m0_to_float",
    "wo_a_forward",
]
