// The 256 values of an FP8 encoding, decoded once per call, for CPU loops that then index the table
// instead of decoding every byte.
#pragma once

#include <array>
#include <cstdint>

#include "dsv4/fp8.h"

namespace dsv4::cpu {

// decode(tag, code): the per-byte rule, with the format as a compile-time tag (std::integral_constant).
template <typename Decode>
std::array<float, 256> decode_table(Fp8Format format, Decode decode) {
  std::array<float, 256> table{};
  with_fp8_format(format, [&](auto tag) {
    for (int code = 0; code < 256; ++code) table[code] = decode(tag, static_cast<uint8_t>(code));
  });
  return table;
}

// The plain decode of dsv4/fp8.h.
inline std::array<float, 256> fp8_decode_table(Fp8Format format) {
  return decode_table(format, [](auto tag, uint8_t code) { return fp8_decode<decltype(tag)::value>(code); });
}

}  // namespace dsv4::cpu
