#include "fp8_cpu.h"

namespace dsv4::cpu {

void ue8m0_to_float(const uint8_t* scale, float* out, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) out[i] = ue8m0_decode(scale[i]);
}

void float_to_ue8m0_lossless(const float* scale, uint8_t* bytes, uint8_t* refusal, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) refusal[i] = static_cast<uint8_t>(ue8m0_from_float_exact(scale[i], &bytes[i]));
}

void fp8_encode(const void* x, FloatKind x_kind, uint8_t* out, Fp8Format format, float quant_max, int64_t begin,
                int64_t end) {
  with_fp8_format(format, [&](auto format_tag) {
    constexpr Fp8Format kFormat = decltype(format_tag)::value;
    for (int64_t i = begin; i < end; ++i) out[i] = fp8_encode_clamped<kFormat>(load_float(x, x_kind, i), quant_max);
  });
}

namespace {

// The 256 decoded values of the format (from the shared fp8_decode), then one multiply per element.
template <Fp8Format F, FloatKind O>
void dequantize_rows(const uint8_t* x, const void* scale, ScaleKind scale_kind, void* out,
                     const BlockScaleGeometry& geometry, int64_t begin, int64_t end) {
  float decoded[256];
  for (int code = 0; code < 256; ++code) decoded[code] = dequantize_value<F>(static_cast<uint8_t>(code), 1.0f);
  const int64_t cols = geometry.cols;
  for (int64_t row = begin; row < end; ++row) {
    const int64_t scale_offset = geometry.scale_row_offset(row);
    for (int64_t block = 0; block < geometry.scale_cols; ++block) {
      const float block_scale = load_block_scale(scale, scale_kind, scale_offset + block);
      const int64_t first = block * geometry.block_cols;
      const int64_t last = first + geometry.block_cols < cols ? first + geometry.block_cols : cols;
      for (int64_t col = first; col < last; ++col) {
        const int64_t index = row * cols + col;
        store_float(out, O, index, decoded[x[index]] * block_scale);
      }
    }
  }
}

}  // namespace

void fp8_block_dequantize(const uint8_t* x, const void* scale, ScaleKind scale_kind, void* out, FloatKind out_kind,
                          const BlockScaleGeometry& geometry, Fp8Format format, int64_t begin, int64_t end) {
  with_fp8_format(format, [&](auto format_tag) {
    constexpr Fp8Format kFormat = decltype(format_tag)::value;
    if (out_kind == FloatKind::kBFloat16) {
      dequantize_rows<kFormat, FloatKind::kBFloat16>(x, scale, scale_kind, out, geometry, begin, end);
    } else {
      dequantize_rows<kFormat, FloatKind::kFloat32>(x, scale, scale_kind, out, geometry, begin, end);
    }
  });
}

void e4m3fn_to_fnuz_weight(const uint8_t* weight_in, uint8_t* weight_out, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) weight_out[i] = ocp_byte_to_fnuz_byte(weight_in[i]);
}

void e4m3fn_to_fnuz_scale(const void* scale_in, void* scale_out, ScaleKind scale_kind, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) double_block_scale(scale_in, scale_out, scale_kind, i);
}

}  // namespace dsv4::cpu
