// core/philox.h: the counter-based random number generator (Philox 4x32-10, Salmon et al., SC'11)
// and the mapping from (seed, offset, element index) to a random value. Host and device code share it,
// so rand/randn/dropout give the same stream on the CPU and on the GPU for the same seed and offset.
//
//   PhiloxBlock r = philox4x32_10({0, 0, 0, 0}, {0, 0});   // r.v[0] == 0x6627e8d5 (Random123 KAT)
//   float u = uniform_at<float>(seed, offset, i);           // element i of a rand() call, in [0, 1)
//
// Stream layout: key = the 64-bit seed; counter = (block, 0, 0) where block = offset + i / 4 (64 bits in
// the first two counter words; the last two are zero, left for independent streams later). Element i
// takes word i % 4 of its block. A call that draws n values advances the generator's offset by
// ceil(n / 4) blocks, so consecutive calls never reuse a block.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/float16.h"

namespace ampscope {

struct PhiloxBlock {
  std::uint32_t v[4];
};

namespace detail {
inline constexpr std::uint32_t kPhiloxM0 = 0xD2511F53u;
inline constexpr std::uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr std::uint32_t kPhiloxW0 = 0x9E3779B9u;  // golden ratio
inline constexpr std::uint32_t kPhiloxW1 = 0xBB67AE85u;  // sqrt(3) - 1
}  // namespace detail

AMPSCOPE_HD inline PhiloxBlock philox4x32_10(PhiloxBlock ctr, const std::uint32_t key_in[2]) {
  std::uint32_t k0 = key_in[0], k1 = key_in[1];
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(detail::kPhiloxM0) * ctr.v[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(detail::kPhiloxM1) * ctr.v[2];
    const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    ctr = PhiloxBlock{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
    k0 += detail::kPhiloxW0;
    k1 += detail::kPhiloxW1;
  }
  return ctr;
}

// The Philox block `block` of the stream keyed by `seed`.
AMPSCOPE_HD inline PhiloxBlock philox_block(std::uint64_t seed, std::uint64_t block) {
  const std::uint32_t key[2] = {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)};
  return philox4x32_10(PhiloxBlock{{static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32), 0u, 0u}},
                       key);
}

// Uniform in [0, 1) from 32 random bits: as many bits as the target's significand holds (24 for f32,
// 11 for f16, 8 for bf16; all 32 for f64), so the value is exact in the target type and rounding can
// never produce 1.0.
template <class T>
AMPSCOPE_HD inline T uniform_from_bits(std::uint32_t x) {
  if constexpr (std::is_same_v<T, double>) {
    return static_cast<double>(x) * 0x1p-32;
  } else if constexpr (std::is_same_v<T, f16>) {
    return f16(static_cast<float>(x >> 21) * 0x1p-11f);
  } else if constexpr (std::is_same_v<T, bf16>) {
    return bf16(static_cast<float>(x >> 24) * 0x1p-8f);
  } else {
    return static_cast<float>(x >> 8) * 0x1p-24f;
  }
}

// Element i of a uniform [0, 1) draw starting at `offset`.
template <class T>
AMPSCOPE_HD inline T uniform_at(std::uint64_t seed, std::uint64_t offset, std::uint64_t i) {
  const PhiloxBlock b = philox_block(seed, offset + i / 4);
  return uniform_from_bits<T>(b.v[i % 4]);
}

// Element i of a standard normal draw starting at `offset`: Box-Muller in double on words (0, 1) or
// (2, 3) of the element's block, cosine branch for even i, sine branch for odd i. Computed in double and
// rounded to float for every dtype (f64 too; then to f16/bf16 where asked): the CPU's and the GPU's
// double log/sin/cos differ in their last bits, and the float rounding hides that except when those
// bits straddle a float rounding boundary (about 1 value in 2^27).
AMPSCOPE_HD inline float normal_at(std::uint64_t seed, std::uint64_t offset, std::uint64_t i) {
  const PhiloxBlock b = philox_block(seed, offset + i / 4);
  const unsigned pair = static_cast<unsigned>(i % 4) / 2;
  const double u1 = (static_cast<double>(b.v[2 * pair]) + 1.0) * 0x1p-32;  // (0, 1]: log never sees 0
  const double u2 = static_cast<double>(b.v[2 * pair + 1]) * 0x1p-32;     // [0, 1)
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = 6.283185307179586476925286766559 * u2;
  return static_cast<float>((i % 2 == 0) ? r * std::cos(theta) : r * std::sin(theta));
}

}  // namespace ampscope
