// tests/kernels/block_scaled_cuda_test.cpp: the CUDA block-scaled conversions (kernels/cuda/block_scaled_cuda.h)
// against core/block_scaled's CPU results, which tests/core/block_scaled_test.cpp checks against the
// specifications' formulas computed independently in double. On the GPU, bit for bit:
// - MXFP8: codes and E8M0 scales, rowwise and columnwise blocks, floor and round-up rules, E4M3 and E5M2
//   elements; the dequantized values;
// - NVFP4: the global amax and scales (reduced on the device), E4M3 block scales and E2M1 codes for 1x16 and
//   16x16 tiles, round-to-nearest-even and stochastic rounding (the CPU's Philox element indexing); the
//   dequantized values;
// - the 16-point Hadamard transform and its inverse (NaN outputs: NaN on both sides).
// The inputs are random blocks and adversarial ones (ties, zeros, one outlier, all subnormal, NaN and inf inside a
// block, values near FLT_MAX, a dynamic range past E8M0's), at the edge shapes (one block, 32x32, 64x96, 16x16
// tiles) and a 4M-value tensor whose amax the device reduces over many blocks. Every GPU test skips, saying why,
// without a GPU (SKIP_WITHOUT_GPU; AMPSCOPE_REQUIRE_GPU=1 fails instead). The argument checks run everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/block_scaled.h"
#include "core/device.h"
#include "tests/test_support.h"
#if defined(AMPSCOPE_WITH_CUDA)
#include "kernels/cuda/block_scaled_cuda.h"
#endif

namespace ampscope {
namespace {

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// ------------------------------------------------------------------------------------------------ inputs

constexpr int kPatterns = 10;

// The value at position k of a block of n values with pattern p (rng: the block's own stream).
float pattern_value(int p, int k, int n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  switch (p) {
    case 0:  // random, one binade of scale per block
      return std::ldexp(normal(rng), exponent(rng));
    case 1:  // zeros of both signs
      return k % 2 ? -0.0f : 0.0f;
    case 2:  // one outlier that flattens the rest
      return k == n / 3 ? 1.0e4f : 1.0e-3f * normal(rng);
    case 3: {  // all f32 subnormals
      std::uniform_int_distribution<std::uint32_t> m(1, 0x7FFFFFu);
      return float_of(m(rng) | (k % 2 ? 0x80000000u : 0u));
    }
    case 4: {  // ties: E2M1 midpoints (0.25 .. 5) and E4M3 midpoints, with the block's largest value on the grid
      static constexpr float kTies[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 1.0625f, 17.0f, 9.5f, 0.0068359375f};
      if (k == 0) return 6.0f;
      if (k == 1) return 448.0f;
      return (k % 2 ? -1.0f : 1.0f) * kTies[k % 11];
    }
    case 5:  // a NaN inside (a payload and a sign of its own)
      return k == n / 2 ? float_of(0xFFC01234u) : normal(rng);
    case 6:  // an infinity inside
      return k == n - 1 ? -std::numeric_limits<float>::infinity() : normal(rng);
    case 7:  // near FLT_MAX
      return (k % 3 ? 1.0f : -1.0f) * std::ldexp(1.0f + 0.5f * std::fabs(normal(rng)) / 4.0f, 127);
    case 8: {  // a dynamic range past E8M0's and E4M3's: 2^-140 .. 2^120
      std::uniform_int_distribution<int> e(-140, 120);
      return std::ldexp(1.0f + std::fabs(normal(rng)) / 8.0f, e(rng));
    }
    default:  // tiny blocks: amax below 2^-127 (round-up's code 0 multiplies by 1)
      return std::ldexp(normal(rng), -130);
  }
}

// A rows x cols matrix whose bh x bw blocks (in row-major block order) cycle through the patterns, each block
// from its own seeded stream.
std::vector<float> block_matrix(std::int64_t rows, std::int64_t cols, std::int64_t bh, std::int64_t bw,
                                std::uint32_t seed) {
  std::vector<float> x(static_cast<std::size_t>(rows * cols));
  const std::int64_t per_row = cols / bw;
  for (std::int64_t br = 0; br < rows / bh; ++br) {
    for (std::int64_t bc = 0; bc < per_row; ++bc) {
      const std::int64_t b = br * per_row + bc;
      std::mt19937 rng(seed * 7919u + static_cast<std::uint32_t>(b));
      const int p = static_cast<int>((b + seed) % kPatterns);
      for (std::int64_t k = 0; k < bh * bw; ++k) {
        const std::int64_t r = br * bh + k / bw, c = bc * bw + k % bw;
        x[static_cast<std::size_t>(r * cols + c)] = pattern_value(p, static_cast<int>(k), static_cast<int>(bh * bw), rng);
      }
    }
  }
  return x;
}

#if defined(AMPSCOPE_WITH_CUDA)

// ---------------------------------------------------------------------------- checks without a GPU

Backend& cpu() { return backend_for(Device::cpu()); }

// The shape checks are the CPU functions' own (text included) and come before any device work, so they run here.
TEST(block_scaled_cuda_test, shapes_the_cpu_refuses_are_refused_with_its_message) {
  EXPECT_THROW_MSG(cuda::mxfp8_quantize(cpu(), {.x = nullptr, .rows = 4, .cols = 48, .options = {}}), ShapeError,
                   "quantize_mxfp8 (CUDA): 1x32 blocks along rows need cols to be a multiple of 32, but the matrix is 4x48",
                   "hint: pad cols to a multiple of 32, or keep this tensor in bf16");
  cuda::MxQuantizeDeviceArgs column{.rows = 48, .cols = 4, .options = {}};
  column.options.axis = BlockAxis::along_column;
  EXPECT_THROW_MSG(cuda::mxfp8_quantize(cpu(), column), ShapeError,
                   "quantize_mxfp8 (CUDA): 32x1 blocks down columns need rows to be a multiple of 32");
  EXPECT_THROW_MSG(cuda::mxfp8_dequantize(cpu(), {.rows = -1, .cols = 32, .options = {}}), ShapeError,
                   "dequantize_mxfp8 (CUDA): a -1x32 matrix has a negative dimension");
  cuda::Nvfp4QuantizeDeviceArgs square{.rows = 8, .cols = 16, .options = {}};
  square.options.tile = Nvfp4Tile::square_16x16;
  EXPECT_THROW_MSG(cuda::nvfp4_quantize(cpu(), square), ShapeError,
                   "quantize_nvfp4 (CUDA): 16x16 tiles need rows to be a multiple of 16, but the matrix is 8x16");
  EXPECT_THROW_MSG(cuda::nvfp4_dequantize(cpu(), {.rows = 2, .cols = 24}), ShapeError,
                   "dequantize_nvfp4 (CUDA): 1x16 blocks along rows need cols to be a multiple of 16");
  EXPECT_THROW_MSG(cuda::random_hadamard_transform(cpu(), nullptr, 20, nullptr), ShapeError,
                   "random_hadamard_transform (CUDA): 20 values are not a whole number of 16-value groups",
                   "hint: the transform runs over the dimension it is applied to in groups of 16");
  // The CPU refuses the same shapes with the same words.
  EXPECT_THROW_MSG(quantize_mxfp8(std::vector<float>(4 * 48), 4, 48), ShapeError,
                   "quantize_mxfp8: 1x32 blocks along rows need cols to be a multiple of 32, but the matrix is 4x48");
}

TEST(block_scaled_cuda_test, a_backend_that_is_not_cudas_is_refused) {
  EXPECT_THROW_MSG(cuda::mxfp8_quantize(cpu(), {.rows = 1, .cols = 32, .options = {}}), DeviceError,
                   "quantize_mxfp8 (CUDA): backend 'cpu' is not a CUDA backend");
  EXPECT_THROW_MSG(cuda::inverse_random_hadamard_transform(cpu(), nullptr, 16, nullptr), DeviceError,
                   "inverse_random_hadamard_transform (CUDA): backend 'cpu' is not a CUDA backend");
}

// -------------------------------------------------------------------------------------------- on a GPU

Backend& gpu() { return backend_for(Device::cuda(0)); }

// Device memory holding a copy of `host` (or n zero-initialised-by-nothing bytes), freed at scope exit.
struct DeviceBuffer {
  std::size_t bytes;
  void* ptr;
  explicit DeviceBuffer(std::size_t n) : bytes(n == 0 ? 1 : n), ptr(gpu().allocate(bytes)) {}
  template <class T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    if (!host.empty()) gpu().copy_from_host(ptr, host.data(), host.size() * sizeof(T));
  }
  ~DeviceBuffer() { gpu().deallocate(ptr, bytes); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(ptr); }
  template <class T>
  std::vector<T> read(std::size_t n) const {
    std::vector<T> out(n);
    if (n > 0) gpu().copy_to_host(out.data(), ptr, n * sizeof(T));
    return out;
  }
};

// Counts and reports (the first five) differing bytes.
int byte_mismatches(const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want, const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (got[i] != want[i] && ++bad <= 5) {
      ADD_FAILURE() << what << " [" << i << "]: GPU 0x" << std::hex << int(got[i]) << ", CPU 0x" << int(want[i]);
    }
  }
  return bad;
}

// Counts differing float bits; with nan_class, two NaNs count as equal whatever their bits.
int float_mismatches(const std::vector<float>& got, const std::vector<float>& want, const std::string& what,
                     bool nan_class = false) {
  EXPECT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (bits_of(got[i]) == bits_of(want[i])) continue;
    if (nan_class && std::isnan(got[i]) && std::isnan(want[i])) continue;
    if (++bad <= 5) {
      ADD_FAILURE() << what << " [" << i << "]: GPU 0x" << std::hex << bits_of(got[i]) << " (" << got[i] << "), CPU 0x"
                    << bits_of(want[i]) << " (" << want[i] << ")";
    }
  }
  return bad;
}

struct Shape {
  std::int64_t rows, cols;
};

std::string mx_name(Shape s, const MxOptions& o) {
  return std::to_string(s.rows) + "x" + std::to_string(s.cols) +
         (o.axis == BlockAxis::along_row ? " rowwise" : " columnwise") +
         (o.element == Fp8Format::e4m3 ? " e4m3" : " e5m2") + (o.rule == MxScaleRule::floor ? " floor" : " round-up");
}

// Quantizes x on both sides and compares codes, scales and the dequantized values (also the GPU's dequantization
// of the CPU's codes, so a dequantize error cannot hide behind a quantize one).
void check_mx(const std::vector<float>& x, Shape s, const MxOptions& o) {
  const std::string what = mx_name(s, o);
  const MxTensor want = quantize_mxfp8(x, s.rows, s.cols, o);
  const std::vector<float> want_back = dequantize_mxfp8(want);
  const std::size_t n = x.size(), nb = n / kMxBlock;
  DeviceBuffer dx(x), codes(n), scales(nb), back(n * sizeof(float));
  cuda::mxfp8_quantize(gpu(), {.x = dx.as<float>(), .rows = s.rows, .cols = s.cols, .options = o,
                               .codes = codes.as<std::uint8_t>(), .scales = scales.as<std::uint8_t>()});
  EXPECT_EQ(byte_mismatches(codes.read<std::uint8_t>(n), want.codes, what + " codes"), 0);
  EXPECT_EQ(byte_mismatches(scales.read<std::uint8_t>(nb), want.scales, what + " scales"), 0);
  DeviceBuffer cpu_codes(want.codes), cpu_scales(want.scales);
  cuda::mxfp8_dequantize(gpu(), {.codes = cpu_codes.as<std::uint8_t>(), .scales = cpu_scales.as<std::uint8_t>(),
                                 .rows = s.rows, .cols = s.cols, .options = o, .out = back.as<float>()});
  EXPECT_EQ(float_mismatches(back.read<float>(n), want_back, what + " dequantized"), 0);
}

TEST(block_scaled_cuda_test, mxfp8_codes_and_scales_are_the_cpus_for_every_rule_axis_and_element) {
  SKIP_WITHOUT_GPU();
  for (Shape s : {Shape{32, 32}, Shape{64, 96}, Shape{96, 64}, Shape{32, 1024}}) {
    for (BlockAxis axis : {BlockAxis::along_row, BlockAxis::along_column}) {
      // The blocks of the pattern run along the axis the quantizer blocks on.
      const bool row = axis == BlockAxis::along_row;
      const std::vector<float> x = block_matrix(s.rows, s.cols, row ? 1 : kMxBlock, row ? kMxBlock : 1,
                                                static_cast<std::uint32_t>(s.rows * 3 + s.cols));
      for (Fp8Format element : {Fp8Format::e4m3, Fp8Format::e5m2}) {
        for (MxScaleRule rule : {MxScaleRule::floor, MxScaleRule::round_up}) {
          check_mx(x, s, {.axis = axis, .element = element, .rule = rule});
        }
      }
    }
  }
}

TEST(block_scaled_cuda_test, mxfp8_single_blocks_and_an_empty_matrix) {
  SKIP_WITHOUT_GPU();
  for (int p = 0; p < kPatterns; ++p) {
    const std::vector<float> row = block_matrix(1, 32, 1, 32, static_cast<std::uint32_t>(p));
    const std::vector<float> col = block_matrix(32, 1, 32, 1, static_cast<std::uint32_t>(p));
    for (MxScaleRule rule : {MxScaleRule::floor, MxScaleRule::round_up}) {
      check_mx(row, {1, 32}, {.axis = BlockAxis::along_row, .rule = rule});
      check_mx(col, {32, 1}, {.axis = BlockAxis::along_column, .rule = rule});
    }
  }
  check_mx({}, {0, 32}, {});
}

std::string nv_name(Shape s, const Nvfp4Options& o) {
  return std::to_string(s.rows) + "x" + std::to_string(s.cols) +
         (o.tile == Nvfp4Tile::row_1x16 ? " 1x16" : " 16x16") + (o.stochastic_rounding ? " stochastic" : " rne");
}

void check_nvfp4(const std::vector<float>& x, Shape s, const Nvfp4Options& o) {
  const std::string what = nv_name(s, o);
  const Nvfp4Tensor want = quantize_nvfp4(x, s.rows, s.cols, o);
  const std::vector<float> want_back = dequantize_nvfp4(want);
  const std::size_t n = x.size(), ns = want.scales.size();
  DeviceBuffer dx(x), codes(n), scales(ns), globals(3 * sizeof(float)), back(n * sizeof(float));
  cuda::nvfp4_quantize(gpu(), {.x = dx.as<float>(), .rows = s.rows, .cols = s.cols, .options = o,
                               .codes = codes.as<std::uint8_t>(), .scales = scales.as<std::uint8_t>(),
                               .globals = globals.as<float>()});
  EXPECT_EQ(float_mismatches(globals.read<float>(3),
                             {want.global_amax, want.global_encode_scale, want.global_decode_scale},
                             what + " global amax, encode, decode"),
            0);
  EXPECT_EQ(byte_mismatches(codes.read<std::uint8_t>(n), want.codes, what + " codes"), 0);
  EXPECT_EQ(byte_mismatches(scales.read<std::uint8_t>(ns), want.scales, what + " scales"), 0);
  // The GPU's dequantization of the CPU's codes and scales.
  DeviceBuffer cpu_codes(want.codes), cpu_scales(want.scales),
      cpu_globals(std::vector<float>{want.global_amax, want.global_encode_scale, want.global_decode_scale});
  cuda::nvfp4_dequantize(gpu(), {.codes = cpu_codes.as<std::uint8_t>(), .scales = cpu_scales.as<std::uint8_t>(),
                                 .rows = s.rows, .cols = s.cols, .tile = o.tile, .globals = cpu_globals.as<float>(),
                                 .out = back.as<float>()});
  EXPECT_EQ(float_mismatches(back.read<float>(n), want_back, what + " dequantized"), 0);
}

TEST(block_scaled_cuda_test, nvfp4_scales_and_codes_are_the_cpus_for_both_tiles_and_roundings) {
  SKIP_WITHOUT_GPU();
  for (Shape s : {Shape{16, 16}, Shape{32, 32}, Shape{64, 96}, Shape{48, 160}}) {
    for (Nvfp4Tile tile : {Nvfp4Tile::row_1x16, Nvfp4Tile::square_16x16}) {
      const bool square = tile == Nvfp4Tile::square_16x16;
      // A matrix whose tiles are each one pattern (NaN and inf ones make the whole tensor's amax NaN or inf, so
      // each shape also runs without them: patterns 0-4 and 7-9 only, by replacing them).
      std::vector<float> x = block_matrix(s.rows, s.cols, square ? 16 : 1, 16, static_cast<std::uint32_t>(s.cols));
      std::vector<float> finite = x;
      for (float& v : finite) {
        if (!std::isfinite(v)) v = 0.5f;
      }
      for (const std::vector<float>* in : {&x, &finite}) {
        for (bool stochastic : {false, true}) {
          Nvfp4Options o{.tile = tile, .stochastic_rounding = stochastic, .stream = {.seed = 0x5eed35u, .offset = 7}};
          check_nvfp4(*in, s, o);
        }
      }
      // Each pattern alone as the whole tensor (its own global amax: zeros, all subnormal, tiny, near FLT_MAX).
      for (int p = 0; p < kPatterns; ++p) {
        std::vector<float> one(static_cast<std::size_t>(s.rows * s.cols));
        std::mt19937 rng(static_cast<std::uint32_t>(p));
        for (std::size_t i = 0; i < one.size(); ++i) {
          one[i] = pattern_value(p, static_cast<int>(i % 256), 256, rng);
        }
        check_nvfp4(one, s, {.tile = tile, .stream = {}});
        check_nvfp4(one, s, {.tile = tile, .stochastic_rounding = true, .stream = {.seed = 99, .offset = 0}});
      }
    }
  }
}

// The device's amax over many blocks of threads: the max exactly, or with NaNs the magnitude of the first one in
// row-major order, bits kept, as the CPU's loop finds it.
TEST(block_scaled_cuda_test, nvfp4s_global_amax_over_4m_values_is_the_cpus) {
  SKIP_WITHOUT_GPU();
  const Shape s{1024, 4096};
  std::vector<float> x(static_cast<std::size_t>(s.rows * s.cols));
  std::mt19937 rng(4096);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  x[3'000'001] = -37.5f;  // the largest, late in the tensor
  check_nvfp4(x, s, {});
  x[2'999'999] = float_of(0xFF800777u);  // a signalling NaN (its magnitude is the CPU's amax)
  x[3'500'000] = float_of(0x7FC00001u);  // a later NaN with other bits
  x[12] = std::numeric_limits<float>::infinity();
  check_nvfp4(x, s, {.stochastic_rounding = true, .stream = {.seed = 1, .offset = 1u << 20}});
}

TEST(block_scaled_cuda_test, the_hadamard_transform_is_the_cpus_in_both_directions) {
  SKIP_WITHOUT_GPU();
  std::vector<float> x = block_matrix(64, 96, 1, 16, 16);  // every pattern, NaN and inf groups included
  std::mt19937 rng(16);
  std::uniform_int_distribution<std::uint32_t> any(0, 0xFFFFFFFFu);
  for (int i = 0; i < 4096; ++i) x.push_back(float_of(any(rng)));  // arbitrary bit patterns
  const std::int64_t n = static_cast<std::int64_t>(x.size());
  const std::vector<float> want = random_hadamard_transform(x);
  const std::vector<float> want_inverse = inverse_random_hadamard_transform(x);
  DeviceBuffer dx(x), y(x.size() * sizeof(float)), z(x.size() * sizeof(float));
  cuda::random_hadamard_transform(gpu(), dx.as<float>(), n, y.as<float>());
  cuda::inverse_random_hadamard_transform(gpu(), dx.as<float>(), n, z.as<float>());
  // Double sums rounded once: the same bits; NaN outputs are NaN on both sides (their bits are the hardware's).
  EXPECT_EQ(float_mismatches(y.read<float>(x.size()), want, "transform", true), 0);
  EXPECT_EQ(float_mismatches(z.read<float>(x.size()), want_inverse, "inverse", true), 0);
  // And the round trip on the device of finite inputs is the CPU's round trip (values near FLT_MAX can become inf
  // and then NaN: NaN on both sides).
  std::vector<float> finite(x.begin(), x.begin() + 64 * 96);
  for (float& v : finite) {
    if (!std::isfinite(v)) v = 1.0f;
  }
  const std::int64_t m = static_cast<std::int64_t>(finite.size());
  DeviceBuffer df(finite), t(finite.size() * sizeof(float)), back(finite.size() * sizeof(float));
  cuda::random_hadamard_transform(gpu(), df.as<float>(), m, t.as<float>());
  cuda::inverse_random_hadamard_transform(gpu(), t.as<float>(), m, back.as<float>());
  EXPECT_EQ(float_mismatches(back.read<float>(finite.size()),
                             inverse_random_hadamard_transform(random_hadamard_transform(finite)), "round trip", true),
            0);
}

#else

TEST(block_scaled_cuda_test, needs_a_cuda_build) { GTEST_SKIP() << "built without CUDA (AMPSCOPE_WITH_CUDA off)"; }

#endif

}  // namespace
}  // namespace ampscope
