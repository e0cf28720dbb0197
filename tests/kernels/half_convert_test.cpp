// tests/kernels/half_convert_test.cpp: the CPU backend's bulk f16/bf16 conversions
// (kernels/half_convert.h) and the kernels that use them give the same bits on the F16C path and on
// the portable one. The exhaustive comparisons (all 2^16 patterns widened, all 2^32 floats narrowed,
// against the CPU's instruction and the independent bf16 reference) are in tests/core/float16_test.cpp;
// here: every length and offset of the 8-wide loops' tails, the switch (AMPSCOPE_NO_F16C and
// set_f16c_enabled), and the kernels on inputs that hold every kind of value (NaN payloads, infinities,
// subnormals, signed zeros, values that overflow f16): each kernel's output with F16C against its output
// on the portable path and against a scalar loop written here from core/convert.h.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/convert.h"
#include "core/float16.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/half_convert.h"

namespace ampscope {
namespace {

// Sets the fast path for the test's lifetime and restores what was active.
class FastPath {
 public:
  explicit FastPath(bool on) : was_(cpu::f16c_active()) { cpu::set_f16c_enabled(on); }
  ~FastPath() { cpu::set_f16c_enabled(was_); }

 private:
  bool was_;
};

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Floats that reach every branch of the f16 and bf16 roundings: NaNs with high and low payloads (quiet and
// signalling, both signs), infinities, signed zeros, float and f16 subnormals, the f16 overflow threshold
// and its neighbours, ties, and ordinary values; then a pseudo-random tail.
std::vector<float> interesting_floats(std::size_t n) {
  const std::uint32_t patterns[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu, 0x7FA00000u,
                                    0x7F800000u, 0xFF800000u, 0x00000000u, 0x80000000u, 0x00000001u, 0x807FFFFFu,
                                    0x33000000u, 0x33000001u, 0x38800000u, 0x387FFFFFu, 0x477FEFFFu, 0x477FF000u,
                                    0x477FE000u, 0xC77FF000u, 0x3F808000u, 0x3F818000u, 0x3F801000u, 0x3F803000u,
                                    0x7F7F8000u, 0x7F7F7FFFu, 0x3F800000u, 0xBF800000u, 0x42F60000u, 0x4E6E6B28u};
  std::vector<float> v;
  for (std::uint32_t p : patterns) {
    float f;
    std::memcpy(&f, &p, sizeof f);
    v.push_back(f);
  }
  std::uint64_t state = 0x9E3779B97F4A7C15ull;
  while (v.size() < n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const auto u = static_cast<std::uint32_t>(state >> 32);
    float f;
    std::memcpy(&f, &u, sizeof f);
    v.push_back(f);
  }
  v.resize(n);
  return v;
}

TEST(half_convert_test, the_switch_follows_the_cpu_and_set_f16c_enabled) {
  {
    FastPath on(true);
    EXPECT_EQ(cpu::f16c_active(), cpu::cpu_has_f16c());
  }
  FastPath off(false);
  EXPECT_FALSE(cpu::f16c_active());
}

// Every length 0..40 at every start offset 0..7 (the 8-wide loops' tails and unaligned loads), both
// directions, both formats: the fast path writes exactly the portable path's bits and nothing outside
// [0, n) (the sentinel after the range stays).
TEST(half_convert_test, every_tail_length_and_offset_gives_the_portable_bits) {
  const std::vector<float> src = interesting_floats(64);
  for (int offset = 0; offset < 8; ++offset) {
    for (int n = 0; n <= 40; ++n) {
      SCOPED_TRACE("offset " + std::to_string(offset) + ", n " + std::to_string(n));
      const float* in = src.data() + offset;
      std::vector<f16> hf(56, f16::from_bits(0xABCD)), hp(56, f16::from_bits(0xABCD));
      std::vector<bf16> bf(56, bf16::from_bits(0xABCD)), bp(56, bf16::from_bits(0xABCD));
      {
        FastPath on(true);
        cpu::narrow_f16(in, hf.data() + offset, n);
        cpu::narrow_bf16(in, bf.data() + offset, n);
      }
      cpu::narrow_f16_portable(in, hp.data() + offset, n);
      cpu::narrow_bf16_portable(in, bp.data() + offset, n);
      for (int i = 0; i < 56; ++i) {
        ASSERT_EQ(hf[i].bits, hp[i].bits) << "f16 element " << i;
        ASSERT_EQ(bf[i].bits, bp[i].bits) << "bf16 element " << i;
        if (i >= offset && i < offset + n) {
          ASSERT_EQ(hp[i].bits, detail::float_to_f16_bits(in[i - offset])) << i;
          ASSERT_EQ(bp[i].bits, detail::float_to_bf16_bits(in[i - offset])) << i;
        } else {
          ASSERT_EQ(hf[i].bits, 0xABCD) << "written outside the range at " << i;
        }
      }
      std::vector<float> wf(56, -7.0f), wp(56, -7.0f), vf(56, -7.0f), vp(56, -7.0f);
      {
        FastPath on(true);
        cpu::widen_f16(hp.data() + offset, wf.data() + offset, n);
        cpu::widen_bf16(bp.data() + offset, vf.data() + offset, n);
      }
      cpu::widen_f16_portable(hp.data() + offset, wp.data() + offset, n);
      cpu::widen_bf16_portable(bp.data() + offset, vp.data() + offset, n);
      for (int i = 0; i < 56; ++i) {
        ASSERT_EQ(bits(wf[i]), bits(wp[i])) << "f16 -> float element " << i;
        ASSERT_EQ(bits(vf[i]), bits(vp[i])) << "bf16 -> float element " << i;
        if (i >= offset && i < offset + n) {
          ASSERT_EQ(bits(wp[i]), bits(detail::f16_bits_to_float(hp[i].bits))) << i;
        }
      }
    }
  }
}

// Tensors of a dtype holding the values above (rounded to it, so NaN payloads, infinities and subnormals
// of that dtype are among them).
Tensor special(const Shape& shape, DType dtype, std::size_t seed_offset = 0) {
  std::int64_t n = 1;
  for (std::int64_t s : shape) n *= s;
  std::vector<float> v = interesting_floats(static_cast<std::size_t>(n) + seed_offset);
  v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(seed_offset));
  Tensor t = from_values(std::vector<double>(v.begin(), v.end()), shape);  // f32, exact
  return t.to(dtype);
}

// The raw bits of a tensor's storage (contiguous copy first).
std::vector<std::uint16_t> raw16(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<std::uint16_t> out(static_cast<std::size_t>(c.numel()));
  std::memcpy(out.data(), c.data(), out.size() * sizeof(std::uint16_t));
  return out;
}
std::vector<std::uint32_t> raw32(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<std::uint32_t> out(static_cast<std::size_t>(c.numel()));
  std::memcpy(out.data(), c.data(), out.size() * sizeof(std::uint32_t));
  return out;
}

// Runs `ops` with F16C and without, and expects the same bits from each.
void expect_same_bits_on_both_paths(const std::function<std::vector<Tensor>()>& ops) {
  std::vector<Tensor> fast, portable;
  {
    FastPath on(true);
    fast = ops();
  }
  {
    FastPath off(false);
    portable = ops();
  }
  ASSERT_EQ(fast.size(), portable.size());
  for (std::size_t i = 0; i < fast.size(); ++i) {
    SCOPED_TRACE("result " + std::to_string(i) + " (" + std::string(dtype_name(fast[i].dtype())) + ")");
    ASSERT_EQ(fast[i].dtype(), portable[i].dtype());
    if (dtype_size(fast[i].dtype()) == 2) {
      EXPECT_EQ(raw16(fast[i]), raw16(portable[i]));
    } else {
      EXPECT_EQ(raw32(fast[i]), raw32(portable[i]));
    }
  }
}

TEST(half_convert_test, casts_and_element_wise_kernels_give_the_same_bits_with_and_without_f16c) {
  for (DType dtype : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    // 70001 elements: several pool chunks and a block tail; the f32 source holds every special value.
    const Tensor x32 = special({70001}, DType::f32);
    expect_same_bits_on_both_paths([&] {
      const Tensor x = x32.to(dtype), y = special({70001}, dtype, 5);
      const Tensor m = special({300, 233}, dtype), row = special({233}, dtype, 7);
      return std::vector<Tensor>{x,                   x.to(DType::f32),      add(x, y),
                                 mul(x, 0.1),          gelu(x),               silu(y),
                                 add(m.transpose(0, 1), row.reshape({233, 1})), sigmoid(m.transpose(0, 1))};
    });
    // The element-wise results equal a scalar loop over core/convert.h (widen, functor, round once).
    const Tensor x = x32.to(dtype), y = special({70001}, dtype, 5);
    const Tensor sum = add(x, y);
    const std::vector<double> xv = x.values(), yv = y.values(), sv = sum.values();
    for (std::size_t i = 0; i < xv.size(); ++i) {
      const float s = static_cast<float>(xv[i]) + static_cast<float>(yv[i]);
      const double want = std::isnan(s) ? std::numeric_limits<double>::quiet_NaN()
                          : dtype == DType::f16 ? static_cast<double>(static_cast<float>(convert<f16>(s)))
                                                : static_cast<double>(static_cast<float>(convert<bf16>(s)));
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(sv[i])) << i;
      } else {
        ASSERT_EQ(sv[i], want) << i << ": " << xv[i] << " + " << yv[i];
      }
    }
  }
}

// Matrix products: operands widened in bulk (row-major, and transposed a few columns at a time), products
// rounded in bulk after the bias; a weight gradient summed over batches.
TEST(half_convert_test, matrix_products_give_the_same_bits_with_and_without_f16c) {
  Generator gen(5);
  for (DType dtype : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor a32 = randn({3, 67, 131}, gen), b32 = randn({131, 45}, gen), w32 = mul(randn({45, 131}, gen), 300.0);
    const Tensor bias32 = randn({45}, gen);
    expect_same_bits_on_both_paths([&] {
      const Tensor a = a32.to(dtype), b = b32.to(dtype), w = w32.to(dtype), bias = bias32.to(dtype);
      return std::vector<Tensor>{matmul(a, b), linear(a, w, bias), matmul(a.transpose(1, 2).contiguous().transpose(1, 2), b),
                                 matmul(b.transpose(0, 1).expand({3, 45, 131}), a.transpose(1, 2)), bmm(a, a.transpose(1, 2))};
    });
  }
}

}  // namespace
}  // namespace ampscope
