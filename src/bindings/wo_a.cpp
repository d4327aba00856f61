// Bindings of the wo_a ops (schemas in schemas.cpp; spec/wo_a.md): the same checked entry points serve
// the CPU kernels and, in GPU builds, the kernels of src/hip/wo_a on the tensor's current stream.
#include <tuple>

#include "common.h"
#include "cpu/wo_a/wo_a_cpu.h"
#include "wo_a/wo_a_launchers.h"

namespace dsv4::bindings {
namespace {

constexpr int64_t kHeadDim = 512;
constexpr int64_t kRopeDim = 64;
constexpr int64_t kScaleBlock = 128;

bool is_fp8(ScalarType type) { return type == ScalarType::Float8_e4m3fn || type == ScalarType::Float8_e4m3fnuz; }
Fp8Format format_of(ScalarType type) {
  return type == ScalarType::Float8_e4m3fnuz ? Fp8Format::kFNUZ : Fp8Format::kOCP;
}

void check_o(const Tensor& o, const char* op) {
  check_dtype(o, op, "o", {ScalarType::BFloat16});
  STD_TORCH_CHECK(o.dim() == 3 && o.size(2) == kHeadDim && o.size(1) >= 1, op,
                  ": o must have shape [tokens, heads, 512] (head_dim 512), got ", shape_string(o));
  check_contiguous(o, op, "o");
}

RopeTable checked_rope(const Tensor& o, const Tensor& positions, const Tensor& cos_sin, const char* op) {
  check_dtype(positions, op, "positions", {ScalarType::Long, ScalarType::Int});
  STD_TORCH_CHECK(positions.dim() == 1 && positions.size(0) >= o.size(0), op,
                  ": positions must be 1-D with at least ", o.size(0), " entries, got ", shape_string(positions));
  check_contiguous(positions, op, "positions");
  check_dtype(cos_sin, op, "cos_sin", {ScalarType::Float, ScalarType::BFloat16});
  STD_TORCH_CHECK(cos_sin.dim() == 2 && cos_sin.size(1) == kRopeDim && cos_sin.size(0) >= 1, op,
                  ": cos_sin must have shape [positions >= 1, 64] (cos || sin, rope dim 64), got ",
                  shape_string(cos_sin));
  check_contiguous(cos_sin, op, "cos_sin");
  check_same_device(o, "o", positions, "positions", op);
  check_same_device(o, "o", cos_sin, "cos_sin", op);
  return RopeTable{cos_sin.data_ptr(), dtype_of(cos_sin) == ScalarType::BFloat16, cos_sin.size(0),
                   positions.data_ptr(), dtype_of(positions) == ScalarType::Long};
}

InverseRopeGroupQuantArgs checked_group_quant(const Tensor& o, const Tensor& positions, const Tensor& cos_sin,
                                              int64_t num_groups, int64_t group_size, int64_t fp8_format,
                                              double quant_max, bool apply_inverse_rope, const char* op) {
  check_o(o, op);
  STD_TORCH_CHECK(group_size == 32 || group_size == 64 || group_size == 128, op,
                  ": group_size must be 32, 64 or 128, got ", group_size);
  STD_TORCH_CHECK(num_groups > 0 && (o.size(1) * kHeadDim) % num_groups == 0, op, ": num_groups must be positive and ",
                  "divide heads * 512 = ", o.size(1) * kHeadDim, ", got ", num_groups);
  const int64_t d = o.size(1) * kHeadDim / num_groups;
  STD_TORCH_CHECK(d % group_size == 0, op, ": the group width ", d, " must be a multiple of group_size ", group_size);
  const Fp8Format format = checked_fp8_format(fp8_format, op);
  InverseRopeGroupQuantArgs args{};
  args.o = static_cast<const uint16_t*>(o.data_ptr());
  args.rope = checked_rope(o, positions, cos_sin, op);
  args.apply_inverse_rope = apply_inverse_rope;
  args.tokens = o.size(0);
  args.heads = o.size(1);
  args.groups = num_groups;
  args.group_size = group_size;
  args.format = format;
  args.quant_max = checked_quant_max(quant_max, format, op);
  return args;
}

void run_group_quant(const InverseRopeGroupQuantArgs& args, const Tensor& o, const char* op) {
  run_on_device(
      o, args.tokens, op, [&](int64_t b, int64_t e) { cpu::inverse_rope_group_quant(args, b, e); },
      [&]([[maybe_unused]] void* stream) { return DSV4_GPU_LAUNCH(gpu::launch_inverse_rope_group_quant(args, stream)); },
      /*cpu_grain=*/1);
}

std::tuple<Tensor, Tensor> inverse_rope_group_quant(const Tensor& o, const Tensor& positions, const Tensor& cos_sin,
                                                    int64_t num_groups, int64_t group_size, int64_t fp8_format,
                                                    double quant_max, bool apply_inverse_rope) {
  constexpr const char* kOp = "dsv4.inverse_rope_group_quant";
  InverseRopeGroupQuantArgs args = checked_group_quant(o, positions, cos_sin, num_groups, group_size, fp8_format,
                                                       quant_max, apply_inverse_rope, kOp);
  const int64_t d = o.size(1) * kHeadDim / num_groups;
  Tensor x_fp8 = torch::stable::new_empty(o, {o.size(0), num_groups, d}, fp8_dtype(args.format));
  Tensor x_scale = torch::stable::new_empty(o, {o.size(0), num_groups, d / group_size}, ScalarType::Byte);
  args.x_fp8 = static_cast<uint8_t*>(x_fp8.data_ptr());
  args.x_scale = static_cast<uint8_t*>(x_scale.data_ptr());
  args.scale_token_stride = num_groups * (d / group_size);
  args.scale_group_stride = d / group_size;
  args.scale_block_stride = 1;
  run_group_quant(args, o, kOp);
  return {x_fp8, x_scale};
}

void inverse_rope_group_quant_out(const Tensor& o, const Tensor& positions, const Tensor& cos_sin, int64_t num_groups,
                                  int64_t group_size, int64_t fp8_format, double quant_max, bool apply_inverse_rope,
                                  Tensor x_fp8, Tensor x_scale) {
  constexpr const char* kOp = "dsv4.inverse_rope_group_quant.out";
  InverseRopeGroupQuantArgs args = checked_group_quant(o, positions, cos_sin, num_groups, group_size, fp8_format,
                                                       quant_max, apply_inverse_rope, kOp);
  const int64_t d = o.size(1) * kHeadDim / num_groups;
  check_dtype(x_fp8, kOp, "x_fp8", {fp8_dtype(args.format), ScalarType::Byte});  // the bytes follow fp8_format
  STD_TORCH_CHECK(x_fp8.dim() == 3 && x_fp8.size(0) == o.size(0) && x_fp8.size(1) == num_groups && x_fp8.size(2) == d,
                  kOp, ": x_fp8 must have shape [", o.size(0), ", ", num_groups, ", ", d, "], got ", shape_string(x_fp8));
  check_contiguous(x_fp8, kOp, "x_fp8");
  check_dtype(x_scale, kOp, "x_scale", {ScalarType::Byte, ScalarType::Float8_e8m0fnu});
  STD_TORCH_CHECK(x_scale.dim() == 3 && x_scale.size(0) == o.size(0) && x_scale.size(1) == num_groups &&
                      x_scale.size(2) == d / group_size,
                  kOp, ": x_scale must have shape [", o.size(0), ", ", num_groups, ", ", d / group_size, "], got ",
                  shape_string(x_scale));
  check_same_device(o, "o", x_fp8, "x_fp8", kOp);
  check_no_self_overlap(x_scale, kOp, "x_scale");
  check_same_device(o, "o", x_scale, "x_scale", kOp);
  check_writes_apart({{x_fp8, "x_fp8"}, {x_scale, "x_scale"}},
                     {{o, "o"}, {positions, "positions"}, {cos_sin, "cos_sin"}}, kOp);
  args.x_fp8 = static_cast<uint8_t*>(x_fp8.data_ptr());
  args.x_scale = static_cast<uint8_t*>(x_scale.data_ptr());
  args.scale_token_stride = x_scale.stride(0);
  args.scale_group_stride = x_scale.stride(1);
  args.scale_block_stride = x_scale.stride(2);
  run_group_quant(args, o, kOp);
}

Tensor inverse_rope(const Tensor& o, const Tensor& positions, const Tensor& cos_sin) {
  constexpr const char* kOp = "dsv4.inverse_rope";
  check_o(o, kOp);
  InverseRopeArgs args{};
  args.o = static_cast<const uint16_t*>(o.data_ptr());
  args.rope = checked_rope(o, positions, cos_sin, kOp);
  args.tokens = o.size(0);
  args.heads = o.size(1);
  Tensor out = torch::stable::new_empty(o, {o.size(0), o.size(1), kHeadDim});
  args.out = static_cast<uint16_t*>(out.data_ptr());
  run_on_device(
      o, args.tokens, kOp, [&](int64_t b, int64_t e) { cpu::inverse_rope(args, b, e); },
      [&]([[maybe_unused]] void* stream) { return DSV4_GPU_LAUNCH(gpu::launch_inverse_rope(args, stream)); },
      /*cpu_grain=*/4);
  return out;
}

BmmA8W8MxScaleArgs checked_bmm(const Tensor& x, const Tensor& w, const Tensor& x_scale, const Tensor& w_scale,
                               const char* op) {
  STD_TORCH_CHECK(is_fp8(dtype_of(x)) && is_fp8(dtype_of(w)), op,
                  ": x and w must be float8_e4m3fn or float8_e4m3fnuz (decoded per their dtype), got ",
                  dtype_name(dtype_of(x)), " and ", dtype_name(dtype_of(w)));
  STD_TORCH_CHECK(x.dim() == 3 && w.dim() == 3, op, ": x must be [M, G, K] and w [G, N, K], got ", shape_string(x),
                  " and ", shape_string(w));
  const int64_t m = x.size(0), groups = x.size(1), k = x.size(2), n = w.size(1);
  STD_TORCH_CHECK(groups > 0, op, ": x and w must have at least one group (G > 0), got x ", shape_string(x));
  STD_TORCH_CHECK(w.size(0) == groups && w.size(2) == k, op, ": w must be [", groups, ", N, ", k, "], got ",
                  shape_string(w));
  STD_TORCH_CHECK(k % kScaleBlock == 0 && n % kScaleBlock == 0 && k > 0 && n > 0, op,
                  ": K and N must be positive multiples of 128, got K=", k, ", N=", n);
  STD_TORCH_CHECK(x.stride(2) == 1 && w.stride(2) == 1, op, ": x and w must be contiguous along K");
  // Grid y and z (N tiles of 16 columns at small M, groups) hold 65535 each.
  STD_TORCH_CHECK(x.is_cpu() || (groups <= 65535 && n / 16 <= 65535), op,
                  ": on a GPU at most 65535 groups and N of at most 1048560, got G=", groups, ", N=", n);
  check_dtype(x_scale, op, "x_scale", {ScalarType::Byte, ScalarType::Float8_e8m0fnu});
  check_dtype(w_scale, op, "w_scale", {ScalarType::Byte, ScalarType::Float8_e8m0fnu});
  STD_TORCH_CHECK(x_scale.dim() == 3 && x_scale.size(0) == m && x_scale.size(1) == groups &&
                      x_scale.size(2) == k / kScaleBlock && (x_scale.size(2) <= 1 || x_scale.stride(2) == 1),
                  op, ": x_scale must be [", m, ", ", groups, ", ", k / kScaleBlock, "] with a unit last stride, got ",
                  shape_string(x_scale));
  STD_TORCH_CHECK(w_scale.dim() == 3 && w_scale.size(0) == groups && w_scale.size(1) == n / kScaleBlock &&
                      w_scale.size(2) == k / kScaleBlock && (w_scale.size(2) <= 1 || w_scale.stride(2) == 1),
                  op, ": w_scale must be [", groups, ", ", n / kScaleBlock, ", ", k / kScaleBlock,
                  "] with a unit last stride, got ", shape_string(w_scale));
  for (const Tensor* t : {&w, &x_scale, &w_scale}) check_same_device(x, "x", *t, "every other tensor argument", op);
  BmmA8W8MxScaleArgs args{};
  args.x = static_cast<const uint8_t*>(x.data_ptr());
  args.x_stride_m = x.stride(0);
  args.x_stride_g = x.stride(1);
  args.x_format = format_of(dtype_of(x));
  args.w = static_cast<const uint8_t*>(w.data_ptr());
  args.w_stride_g = w.stride(0);
  args.w_stride_n = w.stride(1);
  args.w_format = format_of(dtype_of(w));
  args.x_scale = static_cast<const uint8_t*>(x_scale.data_ptr());
  args.x_scale_stride_m = x_scale.stride(0);
  args.x_scale_stride_g = x_scale.stride(1);
  args.w_scale = static_cast<const uint8_t*>(w_scale.data_ptr());
  args.w_scale_stride_g = w_scale.stride(0);
  args.w_scale_stride_nb = w_scale.stride(1);
  args.m = m;
  args.groups = groups;
  args.n = n;
  args.k = k;
  return args;
}

void run_bmm(BmmA8W8MxScaleArgs& args, const Tensor& out, const char* op) {
  args.out = out.data_ptr();
  args.out_fp32 = dtype_of(out) == ScalarType::Float;
  args.out_stride_m = out.stride(0);
  args.out_stride_g = out.stride(1);
  run_on_device(
      out, args.m, op, [&](int64_t b, int64_t e) { cpu::bmm_a8w8_mxscale(args, b, e); },
      [&]([[maybe_unused]] void* stream) { return DSV4_GPU_LAUNCH(gpu::launch_bmm_a8w8_mxscale(args, stream)); },
      /*cpu_grain=*/1);
}

Tensor bmm_a8w8_mxscale(const Tensor& x, const Tensor& w, const Tensor& x_scale, const Tensor& w_scale,
                        ScalarType out_dtype, bool reduced_precision_block_sums) {
  constexpr const char* kOp = "dsv4.bmm_a8w8_mxscale";
  BmmA8W8MxScaleArgs args = checked_bmm(x, w, x_scale, w_scale, kOp);
  args.reduced_precision_block_sums = reduced_precision_block_sums;
  STD_TORCH_CHECK(out_dtype == ScalarType::BFloat16 || out_dtype == ScalarType::Float, kOp,
                  ": out_dtype must be bfloat16 or float32, got ", dtype_name(out_dtype));
  Tensor out = torch::stable::new_empty(x, {args.m, args.groups, args.n}, out_dtype);
  run_bmm(args, out, kOp);
  return out;
}

void bmm_a8w8_mxscale_out(const Tensor& x, const Tensor& w, const Tensor& x_scale, const Tensor& w_scale, Tensor out,
                          bool reduced_precision_block_sums) {
  constexpr const char* kOp = "dsv4.bmm_a8w8_mxscale.out";
  BmmA8W8MxScaleArgs args = checked_bmm(x, w, x_scale, w_scale, kOp);
  args.reduced_precision_block_sums = reduced_precision_block_sums;
  check_dtype(out, kOp, "out", {ScalarType::BFloat16, ScalarType::Float});
  STD_TORCH_CHECK(out.dim() == 3 && out.size(0) == args.m && out.size(1) == args.groups && out.size(2) == args.n &&
                      (args.n <= 1 || out.stride(2) == 1),
                  kOp, ": out must be [", args.m, ", ", args.groups, ", ", args.n,
                  "] with N contiguous (any M and G strides), got ", shape_string(out));
  check_no_self_overlap(out, kOp, "out");
  check_same_device(x, "x", out, "out", kOp);
  check_writes_apart({{out, "out"}}, {{x, "x"}, {w, "w"}, {x_scale, "x_scale"}, {w_scale, "w_scale"}}, kOp);
  run_bmm(args, out, kOp);
}

void register_wo_a_ops(torch::stable::detail::StableLibrary& m) {
  m.impl("inverse_rope_group_quant", TORCH_BOX(&inverse_rope_group_quant));
  m.impl("inverse_rope_group_quant.out", TORCH_BOX(&inverse_rope_group_quant_out));
  m.impl("inverse_rope", TORCH_BOX(&inverse_rope));
  m.impl("bmm_a8w8_mxscale", TORCH_BOX(&bmm_a8w8_mxscale));
  m.impl("bmm_a8w8_mxscale.out", TORCH_BOX(&bmm_a8w8_mxscale_out));
}

}  // namespace
}  // namespace dsv4::bindings

STABLE_TORCH_LIBRARY_IMPL(dsv4, CPU, m) { dsv4::bindings::register_wo_a_ops(m); }

#if defined(DSV4OPS_WITH_GPU)
STABLE_TORCH_LIBRARY_IMPL(dsv4, CUDA, m) { dsv4::bindings::register_wo_a_ops(m); }
#endif
