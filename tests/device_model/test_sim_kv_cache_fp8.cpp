// The FP8 conversion kernels and the fp8_ds_mla cache writers and reader, on the modelled chip, against the
// CPU implementations: byte for byte (both define bytes), in both encodings (the chip's conversion
// instruction serves its own, software the other).
#include "cpu/fp8/fp8_cpu.h"
#include "cpu/kv_cache/kv_cache_cpu.h"
#include "fp8/fp8_launchers.h"
#include "kv_cache/kv_cache_launchers.h"
#include "sim_test_support.h"

namespace {

using namespace dsv4_sim_test;
using dsv4::Fp8Format;

constexpr Fp8Format kFormats[] = {Fp8Format::kOCP, Fp8Format::kFNUZ};
float default_quant_max(Fp8Format format) { return format == Fp8Format::kOCP ? 448.0f : 224.0f; }

TEST(ModelFp8, EncodeEveryBf16Pattern) {
  std::vector<uint16_t> x(1 << 16);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint16_t>(i);
  for (Fp8Format format : kFormats) {
    for (float quant_max : {default_quant_max(format), 240.0f}) {
      std::vector<uint8_t> got(x.size(), 0xAA), want(x.size(), 0x55);
      ASSERT_EQ(dsv4::gpu::launch_fp8_encode(x.data(), dsv4::FloatKind::kBFloat16, got.data(), x.size(), format,
                                             quant_max, nullptr),
                dsv4::LaunchStatus::kOk);
      dsv4::cpu::fp8_encode(x.data(), dsv4::FloatKind::kBFloat16, want.data(), format, quant_max, 0, x.size());
      EXPECT_TRUE(same_bytes(got, want)) << "format " << static_cast<int>(format) << " quant max " << quant_max;
    }
  }
}

TEST(ModelFp8, EncodeFp32Samples) {
  Random random(11);
  std::vector<float> x(1 << 15);
  for (auto& v : x) {
    const uint64_t bits = random.engine();
    std::memcpy(&v, &bits, sizeof v);
  }
  for (size_t i = 0; i < 2048; ++i) x[i] = static_cast<float>(static_cast<int>(i) - 1024) * 0.2501f;  // ties, +-max
  for (Fp8Format format : kFormats) {
    std::vector<uint8_t> got(x.size()), want(x.size());
    ASSERT_EQ(dsv4::gpu::launch_fp8_encode(x.data(), dsv4::FloatKind::kFloat32, got.data(), x.size(), format,
                                           default_quant_max(format), nullptr),
              dsv4::LaunchStatus::kOk);
    dsv4::cpu::fp8_encode(x.data(), dsv4::FloatKind::kFloat32, want.data(), format, default_quant_max(format), 0,
                          x.size());
    EXPECT_TRUE(same_bytes(got, want));
  }
}

// block dequantize of random codes with `scale` (of `scale_kind`) into `Out` (bf16 bits or fp32), both
// encodings, the modelled chip against the CPU.
template <typename Out, typename Scale>
void check_block_dequantize(Random& random, const dsv4::BlockScaleGeometry& geometry, const std::vector<Scale>& scale,
                            dsv4::ScaleKind scale_kind) {
  constexpr dsv4::FloatKind kOut = sizeof(Out) == 2 ? dsv4::FloatKind::kBFloat16 : dsv4::FloatKind::kFloat32;
  std::vector<uint8_t> x(geometry.numel());
  for (auto& code : x) code = random.byte();
  for (Fp8Format format : kFormats) {
    std::vector<Out> got(x.size()), want(x.size());
    ASSERT_EQ(dsv4::gpu::launch_fp8_block_dequantize(x.data(), scale.data(), scale_kind, got.data(), kOut, geometry,
                                                     format, nullptr),
              dsv4::LaunchStatus::kOk);
    dsv4::cpu::fp8_block_dequantize(x.data(), scale.data(), scale_kind, want.data(), kOut, geometry, format, 0,
                                    geometry.flat_rows());
    EXPECT_TRUE(same_bytes(got, want)) << "format " << static_cast<int>(format);
  }
}

// FN -> FNUZ of `weight` and `scale` (of `scale_kind`), out of place or in place, against the CPU.
template <typename Scale>
void check_fn_to_fnuz(const std::vector<uint8_t>& weight, const std::vector<Scale>& scale, dsv4::ScaleKind scale_kind,
                      bool in_place) {
  std::vector<uint8_t> got(weight.size()), want(weight.size());
  std::vector<Scale> got_scale(scale.size()), want_scale(scale.size());
  if (in_place) got = weight, got_scale = scale;
  ASSERT_EQ(dsv4::gpu::launch_e4m3fn_to_fnuz(in_place ? got.data() : weight.data(), got.data(), weight.size(),
                                             in_place ? got_scale.data() : scale.data(), got_scale.data(), scale_kind,
                                             scale.size(), nullptr),
            dsv4::LaunchStatus::kOk);
  dsv4::cpu::e4m3fn_to_fnuz_weight(weight.data(), want.data(), 0, weight.size());
  dsv4::cpu::e4m3fn_to_fnuz_scale(scale.data(), want_scale.data(), scale_kind, 0, scale.size());
  EXPECT_TRUE(same_bytes(got, want)) << (in_place ? "in place" : "");
  EXPECT_TRUE(same_bytes(got_scale, want_scale)) << (in_place ? "in place" : "");
}

// UE8M0 bytes (a NaN one among them) into bf16; fp32 multipliers into fp32 over blocks that do not divide the
// rows and columns. FN -> FNUZ of every code, with fp32 scales, and in place with every UE8M0 byte.
TEST(ModelFp8, BlockDequantizeAndFnToFnuz) {
  Random random(12);
  std::vector<uint8_t> scale_bytes(2 * 2 * 3);
  for (auto& b : scale_bytes) b = static_cast<uint8_t>(random.integer(100, 140));
  scale_bytes[3] = 255;
  check_block_dequantize<uint16_t>(random, {2, 256, 384, 128, 128, 2, 3}, scale_bytes, dsv4::ScaleKind::kUe8m0);
  check_block_dequantize<float>(random, {1, 200, 300, 128, 128, 2, 3}, random.floats(2 * 3), dsv4::ScaleKind::kFloat32);
  std::vector<uint8_t> weight(1 << 12), every_byte(256);
  for (size_t i = 0; i < weight.size(); ++i) weight[i] = static_cast<uint8_t>(i * 7);
  for (int i = 0; i < 256; ++i) every_byte[i] = static_cast<uint8_t>(i);
  check_fn_to_fnuz(weight, random.floats(16), dsv4::ScaleKind::kFloat32, false);
  check_fn_to_fnuz(weight, every_byte, dsv4::ScaleKind::kUe8m0, true);
}

TEST(ModelFp8, Ue8m0Conversions) {
  std::vector<uint8_t> bytes(256);
  for (int i = 0; i < 256; ++i) bytes[i] = static_cast<uint8_t>(i);
  std::vector<float> got(256), want(256);
  ASSERT_EQ(dsv4::gpu::launch_ue8m0_to_float(bytes.data(), got.data(), 256, nullptr), dsv4::LaunchStatus::kOk);
  dsv4::cpu::ue8m0_to_float(bytes.data(), want.data(), 0, 256);
  EXPECT_TRUE(same_bytes(got, want));
  // Every power of two in range and its neighbours, zero, negatives, Inf, NaN, subnormals.
  std::vector<float> scales;
  for (int e = -130; e <= 128; ++e) {
    const float p = std::ldexp(1.0f, e);
    scales.insert(scales.end(), {p, std::nextafter(p, 0.0f), std::nextafter(p, INFINITY), -p});
  }
  scales.insert(scales.end(), {0.0f, -0.0f, INFINITY, -INFINITY, std::nanf(""), 1e-45f});
  std::vector<uint8_t> byte_got(scales.size()), byte_want(scales.size()), refusal_got(scales.size(), 7),
      refusal_want(scales.size(), 7);
  ASSERT_EQ(dsv4::gpu::launch_float_to_ue8m0_lossless(scales.data(), byte_got.data(), refusal_got.data(),
                                                      scales.size(), nullptr),
            dsv4::LaunchStatus::kOk);
  dsv4::cpu::float_to_ue8m0_lossless(scales.data(), byte_want.data(), refusal_want.data(), 0, scales.size());
  EXPECT_TRUE(same_bytes(byte_got, byte_want));
  EXPECT_TRUE(same_bytes(refusal_got, refusal_want));
}

// A cache of `blocks` blocks of `block_size` records with `pad` spare bytes after each block (canaries).
struct Cache {
  std::vector<uint8_t> bytes;
  dsv4::DsMlaCache view;
  Cache(int64_t blocks, int64_t block_size, int64_t pad) {
    const int64_t stride = block_size * dsv4::ds_mla::kRecordBytes + pad;
    bytes.assign(blocks * stride, 0xC3);
    view = {bytes.data(), blocks, stride, block_size};
  }
};

// Slots for `tokens` tokens: in range, negative, at and past the capacity.
std::vector<int64_t> adversarial_slots(Random& random, int64_t tokens, int64_t capacity) {
  std::vector<int64_t> slots(tokens);
  for (int64_t t = 0; t < tokens; ++t) slots[t] = (t * 7 + 3) % capacity;
  slots[1] = -1;
  slots[2] = -2;
  slots[3] = capacity;
  slots[4] = int64_t{1} << 40;
  slots[5] = capacity - 1;
  (void)random;
  return slots;
}

TEST(ModelKvCache, QuantizeAndInsertMatchesCpuBytes) {
  Random random(21);
  constexpr int64_t kTokens = 37;
  std::vector<uint16_t> k = random.bf16(kTokens * 512, 3.0f);
  k[5 * 512 + 3] = 0x7FC0;    // NaN in a NoPE block
  k[6 * 512 + 70] = 0x7F80;   // +Inf
  k[7 * 512 + 450] = 0xFFC0;  // NaN in the RoPE tail
  for (int i = 0; i < 64; ++i) k[8 * 512 + 64 + i] = 0;  // an all-zero block
  for (Fp8Format format : kFormats) {
    Cache got(6, 16, 40), want(6, 16, 40);
    const std::vector<int64_t> slots = adversarial_slots(random, kTokens, got.view.capacity());
    dsv4::KvInsertArgs args{k.data(), 512, slots.data(), kTokens, got.view, format, default_quant_max(format)};
    ASSERT_EQ(dsv4::gpu::launch_quantize_and_insert_k_cache(args, nullptr), dsv4::LaunchStatus::kOk);
    args.cache = want.view;
    dsv4::cpu::quantize_and_insert_k_cache(args, 0, kTokens);
    EXPECT_TRUE(same_bytes(got.bytes, want.bytes)) << "format " << static_cast<int>(format);
  }
}

// FP8 codes of one encoding at most one step apart (same sign; codes are monotonic in the magnitude).
::testing::AssertionResult fp8_within_one_code(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  for (size_t i = 0; i < got.size(); ++i) {
    if ((got[i] ^ want[i]) & 0x80u || std::abs((got[i] & 0x7f) - (want[i] & 0x7f)) > 1) {
      return ::testing::AssertionFailure() << "element " << i << ": got " << +got[i] << ", want " << +want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// The fused Q/KV op in each of its stores, and its KV-only form with the KV norm. The KV destination byte
// for byte; Q within one bf16 ulp (FP8 Q within one code): the GPU sums a row's squares in another order.
TEST(ModelKvCache, QnormRopeKvInsertMatchesCpu) {
  Random random(22);
  constexpr int64_t kTokens = 19, kHeads = 3, kPadded = 4, kPositions = 64;
  const std::vector<uint16_t> q = random.bf16(kTokens * kHeads * 512, 2.0f);
  std::vector<uint16_t> kv = random.bf16(kTokens * 512, 2.0f);
  // NaN, +Inf and -Inf in NoPE dims: -M in the FP8 rows (NaN and -Inf) and +M; a record's block poisoned by an Inf.
  kv[4 * 512 + 5] = 0x7FC0;
  kv[6 * 512 + 70] = 0x7F80;
  kv[8 * 512 + 200] = 0xFF80;
  const std::vector<uint16_t> kv_norm_weight = random.bf16(512, 1.0f);
  const std::vector<float> cos_sin = rope_table(kPositions);
  std::vector<int64_t> positions(kTokens);
  for (int64_t t = 0; t < kTokens; ++t) positions[t] = (t * 5) % kPositions;
  positions[2] = kPositions;  // past the table: zero Q row, no KV write
  positions[3] = -1;
  const float q_scale_inverse = 0.37f, kv_scale = 0.05f;
  struct Form {
    dsv4::KvRowStore store;
    bool kv_only;
  };
  for (Form form : {Form{dsv4::KvRowStore::kDsMlaRecord, false}, Form{dsv4::KvRowStore::kBf16Row, false},
                    Form{dsv4::KvRowStore::kFp8Row, false}, Form{dsv4::KvRowStore::kDsMlaRecord, true}}) {
    for (Fp8Format format : kFormats) {
      const dsv4::KvRowStore store = form.store;
      const bool fp8_q = store == dsv4::KvRowStore::kFp8Row;
      const int64_t row_bytes = store == dsv4::KvRowStore::kBf16Row ? 1024 : 512;
      Cache record_got(3, 8, 24), record_want(3, 8, 24);
      std::vector<uint8_t> rows_got(3 * 8 * row_bytes + 64, 0xC3), rows_want = rows_got;
      std::vector<uint16_t> q_got(kTokens * kPadded * 512, 0x1234), q_want = q_got;
      std::vector<uint8_t> q8_got(kTokens * kHeads * 512, 0xAA), q8_want = q8_got;
      const std::vector<int64_t> slots = adversarial_slots(random, kTokens, 24);
      dsv4::QnormRopeKvInsertArgs args{};
      args.q_in = form.kv_only ? nullptr : q.data();
      args.q_fp8 = fp8_q ? q8_got.data() : nullptr;
      args.q_out = fp8_q || form.kv_only ? nullptr : q_got.data();
      args.q_scale_inverse = &q_scale_inverse;
      args.kv = kv.data();
      args.kv_row_stride = 512;
      args.kv_norm_weight = form.kv_only ? kv_norm_weight.data() : nullptr;
      args.slot_mapping = slots.data();
      args.insert_tokens = form.kv_only ? kTokens : kTokens - 2;  // else the last two tokens: Q only
      args.position_ids = positions.data();
      args.cos_sin = cos_sin.data();
      args.positions = kPositions;
      args.tokens = kTokens;
      args.heads = form.kv_only ? 0 : kHeads;
      args.padded_heads = form.kv_only ? 0 : (fp8_q ? kHeads : kPadded);
      args.eps = 1e-6f;
      args.apply_q_norm = true;
      args.kv_store = store;
      args.cache = record_got.view;
      args.rows = {rows_got.data(), 3, 8, 8 * row_bytes, row_bytes};
      args.kv_scale = &kv_scale;
      args.format = format;
      args.quant_max = default_quant_max(format);
      ASSERT_EQ(dsv4::gpu::launch_qnorm_rope_kv_insert(args, nullptr), dsv4::LaunchStatus::kOk);
      args.q_fp8 = fp8_q ? q8_want.data() : nullptr;
      args.q_out = fp8_q || form.kv_only ? nullptr : q_want.data();
      args.cache = record_want.view;
      args.rows.bytes = rows_want.data();
      dsv4::cpu::qnorm_rope_kv_insert(args, 0, kTokens);
      const std::string what = "store " + std::to_string(static_cast<int>(store)) + (form.kv_only ? " KV only" : "") +
                               " format " + std::to_string(static_cast<int>(format));
      EXPECT_TRUE(bf16_within_ulps(q_got, q_want, 1)) << what;
      for (int64_t t = 0; t < kTokens && !form.kv_only && !fp8_q; ++t) {  // pad heads and bad positions: +0
        for (int64_t h = 0; h < kPadded; ++h) {
          if (h < kHeads && t != 2 && t != 3) continue;
          for (int i = 0; i < 512; ++i) ASSERT_EQ(q_got[(t * kPadded + h) * 512 + i], 0) << what;
        }
      }
      EXPECT_TRUE(fp8_within_one_code(q8_got, q8_want)) << what;
      EXPECT_TRUE(same_bytes(record_got.bytes, record_want.bytes)) << what;
      EXPECT_TRUE(same_bytes(rows_got, rows_want)) << what;
    }
  }
}

TEST(ModelKvCache, QnormRopeKvInsertRefusesTheKvNormOutsideRecords) {
  const std::vector<uint16_t> weight(512, 0x3f80);
  dsv4::QnormRopeKvInsertArgs args{};
  args.tokens = 1;
  args.kv_norm_weight = weight.data();
  args.kv_store = dsv4::KvRowStore::kBf16Row;
  args.rows.block_size = 8;
  EXPECT_EQ(dsv4::gpu::launch_qnorm_rope_kv_insert(args, nullptr), dsv4::LaunchStatus::kInvalidArgument);
}

TEST(ModelKvCache, DequantizeAndGatherMatchesCpu) {
  Random random(23);
  for (Fp8Format format : kFormats) {
    Cache cache(5, 16, 8);
    const std::vector<uint16_t> k = random.bf16(80 * 512, 3.0f);
    std::vector<int64_t> slots(80);
    for (int64_t t = 0; t < 80; ++t) slots[t] = t;
    dsv4::KvInsertArgs insert{k.data(), 512, slots.data(), 80, cache.view, format, default_quant_max(format)};
    dsv4::cpu::quantize_and_insert_k_cache(insert, 0, 80);
    const std::vector<int32_t> seq_lens = {40, 0, 70, 17};
    const std::vector<int32_t> gather_lens = {40, 3, 25, 100};
    const std::vector<int32_t> table = {0, 1, 2, 3, 4, 3, 2, 1, 4, 9, 0, -1, 1, 0, 2, 3};  // 4 x 4, bad ids
    for (const int32_t* lens : {static_cast<const int32_t*>(nullptr), gather_lens.data()}) {
      std::vector<uint16_t> got(4 * 48 * 512, 0x7777), want = got;
      dsv4::KvGatherArgs args{got.data(), 48 * 512, 512, 48, cache.bytes.data(), 5, cache.view.block_stride, 16,
                              seq_lens.data(), lens, table.data(), 4, 4, 4, 3, format};
      ASSERT_EQ(dsv4::gpu::launch_dequantize_and_gather_k_cache(args, nullptr), dsv4::LaunchStatus::kOk);
      args.out = want.data();
      dsv4::cpu::dequantize_and_gather_k_cache(args, 0, 4);
      EXPECT_TRUE(same_bytes(got, want)) << "format " << static_cast<int>(format);
    }
  }
}

// Q without its norm, written over q_in (no padding), from KV rows 1024 elements apart.
TEST(ModelKvCache, QnormRopeKvInsertInPlaceWithoutQNorm) {
  Random random(24);
  constexpr int64_t kTokens = 6, kHeads = 2, kPositions = 16;
  const std::vector<uint16_t> q = random.bf16(kTokens * kHeads * 512, 2.0f);
  const std::vector<uint16_t> kv = random.bf16(kTokens * 1024, 2.0f);
  const std::vector<float> cos_sin = rope_table(kPositions);
  const std::vector<int64_t> positions = {1, 2, 3, 15, 0, 7};
  const std::vector<int64_t> slots = {0, 5, 9, 2, 14, 3};
  for (Fp8Format format : kFormats) {
    std::vector<uint16_t> q_got = q, q_want = q;
    Cache got(2, 8, 16), want(2, 8, 16);
    dsv4::QnormRopeKvInsertArgs args{};
    args.q_in = q_got.data();
    args.q_out = q_got.data();
    args.kv = kv.data();
    args.kv_row_stride = 1024;
    args.slot_mapping = slots.data();
    args.insert_tokens = kTokens;
    args.position_ids = positions.data();
    args.cos_sin = cos_sin.data();
    args.positions = kPositions;
    args.tokens = kTokens;
    args.heads = kHeads;
    args.padded_heads = kHeads;
    args.eps = 1e-6f;
    args.apply_q_norm = false;
    args.kv_store = dsv4::KvRowStore::kDsMlaRecord;
    args.cache = got.view;
    args.format = format;
    args.quant_max = default_quant_max(format);
    ASSERT_EQ(dsv4::gpu::launch_qnorm_rope_kv_insert(args, nullptr), dsv4::LaunchStatus::kOk);
    args.q_in = q_want.data();
    args.q_out = q_want.data();
    args.cache = want.view;
    dsv4::cpu::qnorm_rope_kv_insert(args, 0, kTokens);
    EXPECT_TRUE(same_bytes(q_got, q_want)) << "format " << static_cast<int>(format);
    EXPECT_TRUE(same_bytes(got.bytes, want.bytes)) << "format " << static_cast<int>(format);
  }
}

}  // namespace
