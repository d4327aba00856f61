// Index and bit arithmetic shared by the kernels (dsv4/platform.h, dsv4/ds_mla.h): the 32-bit fast path of
// divide_index agrees with 64-bit division on both sides of its boundary, record addresses follow the
// block-split fp8_ds_mla layout, and zero_byte_flags marks exactly the zero bytes of a word.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "dsv4/ds_mla.h"
#include "dsv4/platform.h"

namespace {

void expect_split(int64_t a, int64_t b) {
  const dsv4::IndexSplit split = dsv4::divide_index(a, b);
  EXPECT_EQ(split.quotient, a / b) << a << " / " << b;
  EXPECT_EQ(split.remainder, a % b) << a << " % " << b;
}

TEST(DivideIndex, BoundariesOf32BitPath) {
  const int64_t edges[] = {0, 1, 63, 64, 65, (int64_t{1} << 31) - 1, int64_t{1} << 31, (int64_t{1} << 31) + 1,
                           (int64_t{1} << 32) - 1, int64_t{1} << 32, int64_t{1} << 40, INT64_MAX};
  const int64_t divisors[] = {1, 2, 16, 64, 584, (int64_t{1} << 31) - 1, int64_t{1} << 31, int64_t{1} << 33};
  for (int64_t a : edges) {
    for (int64_t b : divisors) expect_split(a, b);
  }
}

TEST(DivideIndex, RandomPairs) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const int shift_a = static_cast<int>(rng() % 63);
    const int shift_b = static_cast<int>(rng() % 40);
    const int64_t a = static_cast<int64_t>(rng() >> (1 + shift_a));
    const int64_t b = static_cast<int64_t>(rng() >> (24 + shift_b)) + 1;
    expect_split(a, b);
  }
}

TEST(RecordAddress, BlockSplitLayout) {
  // block_size 64, blocks 64*584 + 16 bytes apart: slot 130 is block 2, position 2.
  const int64_t stride = 64 * 584 + 16;
  const dsv4::ds_mla::RecordAddress address = dsv4::ds_mla::record_address(130, 64, stride);
  EXPECT_EQ(address.data, 2 * stride + 2 * 576);
  EXPECT_EQ(address.scale, 2 * stride + 64 * 576 + 2 * 8);
  const int64_t huge_slot = (int64_t{1} << 33) + 5;  // past the 32-bit path
  const dsv4::ds_mla::RecordAddress far = dsv4::ds_mla::record_address(huge_slot, 64, stride);
  EXPECT_EQ(far.data, (huge_slot / 64) * stride + 5 * 576);
}

// zero_byte_flags: every byte value at every position of a 32- and a 64-bit word, beside bytes that would
// carry into it (0x00, 0x80, 0xFF) if the test leaked across bytes.
TEST(ZeroByteFlags, EveryByteAtEveryPosition) {
  for (uint32_t filler : {0x01u, 0x80u, 0xFFu, 0x7Fu}) {
    for (uint32_t value = 0; value < 256; ++value) {
      for (int position = 0; position < 8; ++position) {
        uint64_t word = 0;
        for (int i = 0; i < 8; ++i) word |= static_cast<uint64_t>(i == position ? value : filler) << (8 * i);
        uint64_t want = 0;
        for (int i = 0; i < 8; ++i) {
          if (((word >> (8 * i)) & 0xFF) == 0) want |= uint64_t{0x80} << (8 * i);
        }
        EXPECT_EQ(dsv4::zero_byte_flags(word), want) << std::hex << word;
        if (position < 4) {
          const auto narrow = static_cast<uint32_t>(word);
          EXPECT_EQ(dsv4::zero_byte_flags(narrow), static_cast<uint32_t>(want)) << std::hex << narrow;
        }
      }
    }
  }
}

}  // namespace
