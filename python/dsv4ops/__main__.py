"""python -m dsv4ops [info] -- what this install is and what runs where.

Prints versions, the build's backend and archs with their FP8 encodings, this machine's devices with
their arch and FP8 format, and which path (kernel, the indexer logits' Triton fallback or the PyTorch
reference, with the reason) each op takes on each device.
"""

from __future__ import annotations

import argparse
import sys

import torch

import dsv4ops
from dsv4ops import dispatch, indexer, platform

OPS = ("ue8m0_to_float", "float_to_ue8m0_lossless", "fp8_encode", "fp8_block_dequantize", "e4m3fn_to_fnuz",
       "qnorm_rope_kv_insert", "qnorm_rope_kv_insert_full_cache_bf16", "qnorm_rope_kv_insert_full_cache_fp8",
       "kv_rope_quant_insert", "kv_norm_rope_quant_insert", "quantize_and_insert_k_cache",
       "dequantize_and_gather_k_cache", "mhc_pre", "mhc_post", "mhc_fused_post_pre", "hc_head",
       "inverse_rope_group_quant", "inverse_rope", "bmm_a8w8_mxscale", "sparse_mla_decode",
       "fp8_mqa_logits", "fp8_paged_mqa_logits", "topk_per_row_prefill", "topk_per_row_decode")


def info(out=sys.stdout) -> int:
    build = platform.build_info()
    print(f"dsv4ops {dsv4ops.__version__}", file=out)
    print(f"  torch {torch.__version__} (extension built against {build['torch_built_with']}, stable ABI "
          f"target {build['torch_stable_abi_target']})", file=out)
    print(f"  backend: {build['backend']}; GPU archs: {', '.join(build['gpu_archs']) or 'none'}", file=out)
    print(f"  compilers: {build['cxx_compiler']}; GPU: {build['gpu_compiler']}", file=out)
    for arch, enc in build["fp8_encodings"].items():
        hw = ", ".join(enc["hardware_encode"]) or "none (software)"
        print(f"  fp8 on {arch}: native {enc['native'].upper()}, both encodings supported, "
              f"hardware encode: {hw}", file=out)
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    for device in devices:
        fmt = platform.fp8_format(device)
        print(f"device {device}: arch {platform.device_arch(device)}, FP8 {fmt.name} "
              f"(quant max {fmt.default_quant_max:g}, dtype {fmt.torch_dtype})", file=out)
        for op in OPS:
            if op in indexer.LOGITS_OPS:  # these may take the Triton fallback before the reference
                path, reason = indexer.logits_path(op, device)
            else:
                decision = dispatch.explain(op, device)
                path, reason = decision.path, decision.reason
            detail = "" if reason is None else f" ({reason})"
            print(f"  {op:<26} {path}{detail}", file=out)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsv4ops", description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", default="info", choices=["info"], help="what to do (default: info)")
    parser.parse_args(argv)
    return info()


if __name__ == "__main__":
    sys.exit(main())
