// Bindings of the FP8/UE8M0 conversion ops (schemas in schemas.cpp).
#include <algorithm>
#include <cmath>
#include <tuple>

#include "common.h"
#include "cpu/fp8/fp8_cpu.h"
#if defined(DSV4OPS_WITH_GPU)
#include "fp8/fp8_launchers.h"
#endif

namespace dsv4::bindings {
namespace {

std::vector<int64_t> sizes_of(const Tensor& t) {
  std::vector<int64_t> sizes(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) sizes[d] = t.size(d);
  return sizes;
}

ScaleKind scale_kind_of(const Tensor& scale) {
  return dtype_of(scale) == ScalarType::Float ? ScaleKind::kFloat32 : ScaleKind::kUe8m0;
}

FloatKind float_kind_of(ScalarType type) {
  return type == ScalarType::BFloat16 ? FloatKind::kBFloat16 : FloatKind::kFloat32;
}

Tensor ue8m0_to_float(const Tensor& scale) {
  constexpr const char* kOp = "dsv4.ue8m0_to_float";
  check_dtype(scale, kOp, "scale", {ScalarType::Byte, ScalarType::Float8_e8m0fnu});
  check_contiguous(scale, kOp, "scale");
  Tensor out = torch::stable::new_empty(scale, sizes_of(scale), ScalarType::Float);
  const auto* in = static_cast<const uint8_t*>(scale.data_ptr());
  auto* dst = static_cast<float*>(out.data_ptr());
  run_on_device(
      scale, scale.numel(), kOp, [&](int64_t b, int64_t e) { cpu::ue8m0_to_float(in, dst, b, e); },
      [&]([[maybe_unused]] void* stream) {
        return DSV4_GPU_LAUNCH(gpu::launch_ue8m0_to_float(in, dst, scale.numel(), stream));
      });
  return out;
}

std::tuple<Tensor, Tensor> float_to_ue8m0_lossless(const Tensor& scale) {
  constexpr const char* kOp = "dsv4.float_to_ue8m0_lossless";
  check_dtype(scale, kOp, "scale", {ScalarType::Float});
  check_contiguous(scale, kOp, "scale");
  Tensor bytes = torch::stable::new_empty(scale, sizes_of(scale), ScalarType::Byte);
  Tensor refusal = torch::stable::new_empty(scale, sizes_of(scale), ScalarType::Byte);
  const auto* in = static_cast<const float*>(scale.data_ptr());
  auto* bytes_out = static_cast<uint8_t*>(bytes.data_ptr());
  auto* refusal_out = static_cast<uint8_t*>(refusal.data_ptr());
  run_on_device(
      scale, scale.numel(), kOp,
      [&](int64_t b, int64_t e) { cpu::float_to_ue8m0_lossless(in, bytes_out, refusal_out, b, e); },
      [&]([[maybe_unused]] void* stream) {
        return DSV4_GPU_LAUNCH(gpu::launch_float_to_ue8m0_lossless(in, bytes_out, refusal_out, scale.numel(), stream));
      });
  return {bytes, refusal};
}

Tensor fp8_encode(const Tensor& x, int64_t fp8_format, double quant_max) {
  constexpr const char* kOp = "dsv4.fp8_encode";
  check_dtype(x, kOp, "x", {ScalarType::Float, ScalarType::BFloat16});
  check_contiguous(x, kOp, "x");
  const Fp8Format format = checked_fp8_format(fp8_format, kOp);
  const float qmax = checked_quant_max(quant_max, format, kOp);
  Tensor out = torch::stable::new_empty(x, sizes_of(x), fp8_dtype(format));
  const void* in = x.data_ptr();
  auto* dst = static_cast<uint8_t*>(out.data_ptr());
  const FloatKind kind = float_kind_of(dtype_of(x));
  run_on_device(
      x, x.numel(), kOp, [&](int64_t b, int64_t e) { cpu::fp8_encode(in, kind, dst, format, qmax, b, e); },
      [&]([[maybe_unused]] void* stream) {
        return DSV4_GPU_LAUNCH(gpu::launch_fp8_encode(in, kind, dst, x.numel(), format, qmax, stream));
      });
  return out;
}

Tensor fp8_block_dequantize(const Tensor& x, const Tensor& scale, int64_t block_rows, int64_t block_cols,
                            int64_t fp8_format, ScalarType out_dtype) {
  constexpr const char* kOp = "dsv4.fp8_block_dequantize";
  check_dtype(x, kOp, "x", {ScalarType::Byte, ScalarType::Float8_e4m3fn, ScalarType::Float8_e4m3fnuz});
  check_dtype(scale, kOp, "scale", {ScalarType::Byte, ScalarType::Float8_e8m0fnu, ScalarType::Float});
  check_contiguous(x, kOp, "x");
  check_contiguous(scale, kOp, "scale");
  check_same_device(x, "x", scale, "scale", kOp);
  const Fp8Format format = checked_fp8_format(fp8_format, kOp);
  STD_TORCH_CHECK(out_dtype == ScalarType::BFloat16 || out_dtype == ScalarType::Float, kOp,
                  ": out_dtype must be bfloat16 or float32, got ", dtype_name(out_dtype));
  STD_TORCH_CHECK(block_rows > 0 && block_cols > 0, kOp, ": block sizes must be positive, got block_rows=",
                  block_rows, " block_cols=", block_cols);
  STD_TORCH_CHECK(x.dim() >= 2, kOp, ": x must have at least 2 dims [..., rows, cols], got shape ",
                  shape_string(x));
  STD_TORCH_CHECK(scale.dim() == x.dim(), kOp, ": scale must have as many dims as x (", x.dim(),
                  "), got shape ", shape_string(scale));
  const int64_t dims = x.dim();
  BlockScaleGeometry geometry{};
  geometry.batches = 1;
  for (int64_t d = 0; d < dims - 2; ++d) {
    STD_TORCH_CHECK(scale.size(d) == x.size(d), kOp, ": scale dim ", d, " must equal x dim ", d, " (", x.size(d),
                    "), got scale shape ", shape_string(scale), " for x shape ", shape_string(x));
    geometry.batches *= x.size(d);
  }
  geometry.rows = x.size(dims - 2);
  geometry.cols = x.size(dims - 1);
  // The GPU kernel steps 32-bit column indices by its block width: rows stop short of 2^31 by more than
  // any block width.
  constexpr int64_t kMaxCols = INT32_MAX - (int64_t{1} << 16);
  STD_TORCH_CHECK(geometry.cols <= kMaxCols && block_cols <= INT32_MAX, kOp, ": rows of more than ", kMaxCols,
                  " columns (or column blocks of more than 2^31-1) are not supported, got cols=", geometry.cols,
                  " block_cols=", block_cols);
  geometry.block_rows = block_rows;
  geometry.block_cols = block_cols;
  // ceil(n / block) without n + block - 1, which overflows for blocks near 2^63 (and would ask for no scales).
  const auto blocks_of = [](int64_t n, int64_t block) { return n == 0 ? int64_t{0} : 1 + (n - 1) / block; };
  geometry.scale_rows = blocks_of(geometry.rows, block_rows);
  geometry.scale_cols = blocks_of(geometry.cols, block_cols);
  STD_TORCH_CHECK(scale.size(dims - 2) == geometry.scale_rows && scale.size(dims - 1) == geometry.scale_cols, kOp,
                  ": scale must have shape [..., ceil(rows/block_rows), ceil(cols/block_cols)] = [..., ",
                  geometry.scale_rows, ", ", geometry.scale_cols, "] for x shape ", shape_string(x), " and blocks ",
                  block_rows, "x", block_cols, ", got ", shape_string(scale));
  Tensor out = torch::stable::new_empty(x, sizes_of(x), out_dtype);
  const auto* x_bytes = static_cast<const uint8_t*>(x.data_ptr());
  const void* scale_data = scale.data_ptr();
  void* dst = out.data_ptr();
  const ScaleKind scale_kind = scale_kind_of(scale);
  const FloatKind out_kind = float_kind_of(out_dtype);
  run_on_device(
      x, geometry.flat_rows() * (geometry.cols > 0 ? 1 : 0), kOp,
      [&](int64_t b, int64_t e) {
        cpu::fp8_block_dequantize(x_bytes, scale_data, scale_kind, dst, out_kind, geometry, format, b, e);
      },
      [&]([[maybe_unused]] void* stream) {
        return DSV4_GPU_LAUNCH(gpu::launch_fp8_block_dequantize(x_bytes, scale_data, scale_kind, dst, out_kind,
                                                                geometry, format, stream));
      },
      std::max<int64_t>(1, kCpuGrain / std::max<int64_t>(1, geometry.cols)));
  return out;
}

void check_e4m3fn_to_fnuz_inputs(const Tensor& weight, const Tensor& scale, const char* op) {
  check_dtype(weight, op, "weight", {ScalarType::Byte, ScalarType::Float8_e4m3fn});
  check_dtype(scale, op, "scale", {ScalarType::Byte, ScalarType::Float8_e8m0fnu, ScalarType::Float});
  check_contiguous(weight, op, "weight");
  check_contiguous(scale, op, "scale");
  check_same_device(weight, "weight", scale, "scale", op);
}

void e4m3fn_to_fnuz_into(const Tensor& weight, const Tensor& scale, const Tensor& weight_out,
                         const Tensor& scale_out, const char* op) {
  const auto* w_in = static_cast<const uint8_t*>(weight.data_ptr());
  auto* w_out = static_cast<uint8_t*>(weight_out.data_ptr());
  const void* s_in = scale.data_ptr();
  void* s_out = scale_out.data_ptr();
  const ScaleKind kind = scale_kind_of(scale);
  const int64_t weight_numel = weight.numel();
  const int64_t scale_numel = scale.numel();
  // One pass over max(weight, scale) elements converts both.
  run_on_device(
      weight, std::max(weight_numel, scale_numel), op,
      [&](int64_t b, int64_t e) {
        cpu::e4m3fn_to_fnuz_weight(w_in, w_out, std::min(b, weight_numel), std::min(e, weight_numel));
        cpu::e4m3fn_to_fnuz_scale(s_in, s_out, kind, std::min(b, scale_numel), std::min(e, scale_numel));
      },
      [&]([[maybe_unused]] void* stream) {
        return DSV4_GPU_LAUNCH(
            gpu::launch_e4m3fn_to_fnuz(w_in, w_out, weight_numel, s_in, s_out, kind, scale_numel, stream));
      });
}

std::tuple<Tensor, Tensor> e4m3fn_to_fnuz(const Tensor& weight, const Tensor& scale) {
  constexpr const char* kOp = "dsv4.e4m3fn_to_fnuz";
  check_e4m3fn_to_fnuz_inputs(weight, scale, kOp);
  const ScalarType weight_dtype =
      dtype_of(weight) == ScalarType::Float8_e4m3fn ? ScalarType::Float8_e4m3fnuz : ScalarType::Byte;
  Tensor weight_out = torch::stable::new_empty(weight, sizes_of(weight), weight_dtype);
  Tensor scale_out = torch::stable::empty_like(scale);  // keeps float8_e8m0fnu without naming it
  e4m3fn_to_fnuz_into(weight, scale, weight_out, scale_out, kOp);
  return {weight_out, scale_out};
}

void e4m3fn_to_fnuz_inplace(Tensor weight, Tensor scale) {
  constexpr const char* kOp = "dsv4.e4m3fn_to_fnuz_";
  check_e4m3fn_to_fnuz_inputs(weight, scale, kOp);
  e4m3fn_to_fnuz_into(weight, scale, weight, scale, kOp);
}

}  // namespace
}  // namespace dsv4::bindings

namespace {

// The same implementations serve both dispatch keys: each one branches on the tensors' device.
void register_fp8_ops(torch::stable::detail::StableLibrary& m) {
  namespace b = dsv4::bindings;
  m.impl("ue8m0_to_float", TORCH_BOX(&b::ue8m0_to_float));
  m.impl("float_to_ue8m0_lossless", TORCH_BOX(&b::float_to_ue8m0_lossless));
  m.impl("fp8_encode", TORCH_BOX(&b::fp8_encode));
  m.impl("fp8_block_dequantize", TORCH_BOX(&b::fp8_block_dequantize));
  m.impl("e4m3fn_to_fnuz", TORCH_BOX(&b::e4m3fn_to_fnuz));
  m.impl("e4m3fn_to_fnuz_", TORCH_BOX(&b::e4m3fn_to_fnuz_inplace));
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(dsv4, CPU, m) { register_fp8_ops(m); }

#if defined(DSV4OPS_WITH_GPU)
STABLE_TORCH_LIBRARY_IMPL(dsv4, CUDA, m) { register_fp8_ops(m); }
#endif
