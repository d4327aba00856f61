"""Pure-PyTorch implementations of the dsv4 ops: the executable spec, the test oracle, and the fallback
on devices without a native kernel. Written for clarity (float64 arithmetic, no bit tricks shared with
the kernels), so that agreement with the kernels means something."""

from .fp8 import (  # noqa: F401
    UE8M0_DTYPES,
    e4m3fn_to_fnuz,
    float_to_ue8m0_lossless,
    fp8_block_dequantize,
    fp8_decode,
    fp8_encode,
    ue8m0_encode_rceil,
    ue8m0_to_float,
)
from .mhc import hc_head, mhc_fused_post_pre, mhc_post, mhc_pre, sinkhorn  # noqa: F401
from .wo_a import bmm_a8w8_mxscale, inverse_rope, inverse_rope_group_quant  # noqa: F401
from .sparse_mla import sparse_mla_decode  # noqa: F401
from .indexer import fp8_mqa_logits, fp8_paged_mqa_logits, topk_per_row_decode, topk_per_row_prefill  # noqa: F401
