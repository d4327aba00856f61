// Per-element bodies of the FP8/UE8M0 conversion ops, shared by the kernels in this folder and by the
// CPU backend (src/cpu/fp8), so both produce the same bytes. Torch-free, host and device.
#pragma once

#include "dsv4/bf16.h"
#include "dsv4/fp8.h"
#include "dsv4/ue8m0.h"

namespace dsv4 {

// How a block-scale tensor stores its scales.
enum class ScaleKind : int {
  kUe8m0 = 0,    // one byte per block: 2^(u-127)
  kFloat32 = 1,  // fp32 multipliers (DeepSeek-V3-style checkpoints)
};

// Element type of a floating tensor an op reads or writes.
enum class FloatKind : int {
  kFloat32 = 0,
  kBFloat16 = 1,
};

DSV4_HD float load_float(const void* base, FloatKind kind, int64_t index) {
  if (kind == FloatKind::kBFloat16) return bf16_bits_to_float(static_cast<const uint16_t*>(base)[index]);
  return static_cast<const float*>(base)[index];
}

DSV4_HD void store_float(void* base, FloatKind kind, int64_t index, float value) {
  if (kind == FloatKind::kBFloat16) {
    static_cast<uint16_t*>(base)[index] = float_to_bf16_bits(value);
  } else {
    static_cast<float*>(base)[index] = value;
  }
}

DSV4_HD float load_block_scale(const void* base, ScaleKind kind, int64_t index) {
  if (kind == ScaleKind::kUe8m0) return ue8m0_decode(static_cast<const uint8_t*>(base)[index]);
  return static_cast<const float*>(base)[index];
}

// x viewed as [batches, rows, cols]; scale as [batches, scale_rows, scale_cols] with
// scale_rows = ceil(rows / block_rows) and scale_cols = ceil(cols / block_cols). Row-major, contiguous.
// Work is split by flat row (batch * rows + row); columns and block sizes fit in 31 bits (the bindings
// check), so per-column index math is 32-bit.
struct BlockScaleGeometry {
  int64_t batches;
  int64_t rows;
  int64_t cols;
  int64_t block_rows;
  int64_t block_cols;
  int64_t scale_rows;
  int64_t scale_cols;

  DSV4_HD int64_t flat_rows() const { return batches * rows; }
  DSV4_HD int64_t numel() const { return batches * rows * cols; }

  // Index of the first scale that applies to flat row `flat_row`.
  DSV4_HD int64_t scale_row_offset(int64_t flat_row) const {
    const int64_t batch = flat_row / rows;
    const int64_t row = flat_row - batch * rows;
    return (batch * scale_rows + row / block_rows) * scale_cols;
  }
};

// FP8 value times its block scale in fp32, rounded once into the output type by the caller's store.
// With UE8M0 scales the product is exact (a 4-bit significand times a power of two) unless it leaves
// fp32's range.
template <Fp8Format F>
DSV4_HD float dequantize_value(uint8_t code, float scale) {
  return fp8_decode<F>(code) * scale;
}

// Checkpoint normalization for gfx942, scale half: the weight bytes read as FNUZ are worth half, so the
// scale doubles. UE8M0: byte + 1 (254 becomes 255, the E8M0 NaN; 255 stays NaN). fp32: exact x2.
DSV4_HD void double_block_scale(const void* in, void* out, ScaleKind kind, int64_t index) {
  if (kind == ScaleKind::kUe8m0) {
    const uint8_t byte = static_cast<const uint8_t*>(in)[index];
    static_cast<uint8_t*>(out)[index] = byte >= 254 ? kUe8m0NaN : static_cast<uint8_t>(byte + 1);
  } else {
    static_cast<float*>(out)[index] = static_cast<const float*>(in)[index] * 2.0f;
  }
}

}  // namespace dsv4
