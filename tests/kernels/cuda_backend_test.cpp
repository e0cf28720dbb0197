// The CUDA backend against the CPU backend: the same bits for the same inputs. Every test skips itself,
// saying why, when this build has no CUDA backend or the machine has no GPU.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "tests/test_support.h"

#include "core/error.h"
#include "core/float16.h"
#include "core/format.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"

namespace ampscope {
namespace {

std::vector<std::uint8_t> bytes_of(const Tensor& t) {
  const Tensor host = t.contiguous().to(Device::cpu());
  const auto* p = static_cast<const std::uint8_t*>(host.data());
  return {p, p + host.numel() * dtype_size(host.dtype())};
}

// Compares element bits and reports the first few differences with both values.
void expect_same_bits(const Tensor& cpu, const Tensor& gpu, const std::string& what) {
  ASSERT_EQ(cpu.shape(), gpu.shape()) << what;
  const std::vector<std::uint8_t> a = bytes_of(cpu), b = bytes_of(gpu);
  const std::size_t size = dtype_size(cpu.dtype());
  const std::vector<double> va = cpu.values(), vb = gpu.values();
  int shown = 0;
  std::size_t differ = 0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    if (std::memcmp(&a[i * size], &b[i * size], size) != 0) {
      ++differ;
      if (shown++ < 5) {
        ADD_FAILURE() << what << ": element " << i << " cpu " << format_value(va[i], cpu.dtype()) << " cuda "
                      << format_value(vb[i], cpu.dtype());
      }
    }
  }
  EXPECT_EQ(differ, 0u) << what;
}

TEST(cuda_backend_test, copies_every_f16_bit_pattern_to_the_gpu_and_back_unchanged) {
  SKIP_WITHOUT_GPU();
  Tensor host = Tensor::empty({65536}, {DType::f16});
  auto* bits = static_cast<std::uint16_t*>(host.data());
  for (std::uint32_t i = 0; i < 65536; ++i) bits[i] = static_cast<std::uint16_t>(i);
  const Tensor back = host.to(Device::cuda()).to(Device::cpu());
  EXPECT_EQ(std::memcmp(back.data(), host.data(), 65536 * 2), 0);
}

TEST(cuda_backend_test, converts_between_dtypes_with_the_same_bits_as_the_cpu) {
  SKIP_WITHOUT_GPU();
  // Every f16 pattern widened to f32 and f64, and 2^24 float patterns (every 256th of all 2^32, which
  // hits every exponent, both signs, NaNs and infinities) narrowed to f16 and bf16.
  Tensor h = Tensor::empty({65536}, {DType::f16});
  for (std::uint32_t i = 0; i < 65536; ++i) static_cast<std::uint16_t*>(h.data())[i] = static_cast<std::uint16_t>(i);
  const Tensor h_gpu = h.to(Device::cuda());
  for (DType to : {DType::f32, DType::f64, DType::bf16, DType::i64, DType::boolean}) {
    expect_same_bits(h.to(to), h_gpu.to(to), fmt::format("f16 -> {}", dtype_name(to)));
  }
  Tensor f = Tensor::empty({1 << 24}, {DType::f32});
  for (std::uint32_t i = 0; i < (1u << 24); ++i) static_cast<std::uint32_t*>(f.data())[i] = (i << 8) | (i & 0xFF);
  const Tensor f_gpu = f.to(Device::cuda());
  for (DType to : {DType::f16, DType::bf16, DType::f64, DType::i64}) {
    expect_same_bits(f.to(to), f_gpu.to(to), fmt::format("f32 -> {}", dtype_name(to)));
  }
}

// Round half to even at every tie: for each finite f16 (bf16) value and its successor, the f32 exactly
// halfway between them, and the f32 values one ulp either side, narrowed on both backends (the sampled
// patterns above contain no tie). Subnormal f16 ties included; the CPU's result is also checked against
// the rule itself (a tie goes to the even code).
TEST(cuda_backend_test, narrowing_rounds_every_f16_and_bf16_tie_to_even_as_the_cpu_does) {
  SKIP_WITHOUT_GPU();
  for (DType to : {DType::f16, DType::bf16}) {
    std::vector<float> v;
    std::vector<std::uint16_t> even;  // the expected code of each tie
    for (std::uint32_t code = 0; code < 0x10000u; ++code) {
      const auto c = static_cast<std::uint16_t>(code);
      const std::uint16_t next = static_cast<std::uint16_t>(c + 1);
      const bool f16 = to == DType::f16;
      const std::uint16_t exp_mask = f16 ? 0x7C00 : 0x7F80;
      if ((c & exp_mask) == exp_mask || (next & exp_mask) == exp_mask || (c & 0x7FFF) == 0x7FFF) continue;  // inf/NaN
      const double a = f16 ? static_cast<double>(detail::f16_bits_to_float(c)) : detail::bf16_bits_to_float(c);
      const double b = f16 ? static_cast<double>(detail::f16_bits_to_float(next)) : detail::bf16_bits_to_float(next);
      const float tie = static_cast<float>((a + b) / 2);  // exact: both are floats one f16/bf16 ulp apart
      ASSERT_EQ(static_cast<double>(tie), (a + b) / 2);
      v.push_back(tie);
      v.push_back(std::nextafter(tie, -INFINITY));
      v.push_back(std::nextafter(tie, INFINITY));
      even.push_back((c & 1) == 0 ? c : next);
    }
    Tensor f = Tensor::empty({static_cast<std::int64_t>(v.size())}, {DType::f32});
    std::memcpy(f.data(), v.data(), v.size() * sizeof(float));
    const Tensor cpu = f.to(to), gpu = f.to(Device::cuda()).to(to);
    expect_same_bits(cpu, gpu, fmt::format("f32 ties -> {}", dtype_name(to)));
    const auto* got = static_cast<const std::uint16_t*>(cpu.data());
    std::size_t wrong = 0;
    for (std::size_t k = 0; k < even.size(); ++k) wrong += got[3 * k] != even[k];
    EXPECT_EQ(wrong, 0u) << dtype_name(to) << ": ties not rounded to the even code on the CPU";
  }
}

// More rows than one grid covers (4096 blocks of 8 warps: 32,768 rows), so the row kernels' grid-stride
// loop takes a second pass; and fill/copy into non-contiguous outputs (a transposed view, a column slice).
TEST(cuda_backend_test, row_kernels_past_one_grid_and_writes_into_strided_outputs_match_the_cpu) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const std::string d(dtype_name(dtype));
    Generator gen(17);
    const Tensor x = mul(randn({40000, 7}, gen, {dtype}), 4.0);
    const Tensor xg = x.to(Device::cuda());
    expect_same_bits(softmax(x, 1), softmax(xg, 1), "softmax 40000 rows " + d);
    expect_same_bits(log_softmax(x, 1), log_softmax(xg, 1), "log_softmax 40000 rows " + d);
    expect_same_bits(sum(x, std::vector<std::int64_t>{1}), sum(xg, std::vector<std::int64_t>{1}), "sum 40000 rows " + d);

    Tensor a = zeros({6, 9}, {dtype}), ag = zeros({6, 9}, {dtype, Device::cuda()});
    Tensor at = a.transpose(0, 1), agt = ag.transpose(0, 1);  // [9, 6] views of the same storage, strided
    at.fill_(3.5);
    agt.fill_(3.5);
    expect_same_bits(a, ag, "fill through a transposed view " + d);
    const Tensor src = mul(randn({9, 6}, gen, {dtype}), 100.0);
    at.copy_(src);
    agt.copy_(src.to(Device::cuda()));
    expect_same_bits(a, ag, "copy into a transposed view " + d);
    Tensor col = a.slice(1, 2, 9, 3), colg = ag.slice(1, 2, 9, 3);  // columns 2, 5, 8
    col.fill_(-7.25);
    colg.fill_(-7.25);
    expect_same_bits(a, ag, "fill of a column slice " + d);
  }
}

TEST(cuda_backend_test, random_streams_are_identical_on_cpu_and_gpu) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    Generator a(31337), b(31337);
    a.set_offset(5);
    b.set_offset(5);
    expect_same_bits(rand({100003}, a, {dtype}), rand({100003}, b, {dtype, Device::cuda()}),
                     fmt::format("rand {}", dtype_name(dtype)));
    // randn goes through each side's libm (log, sin, cos in double); see core/philox.h for why the
    // float result still matches except in about 1 value in 2^28.
    expect_same_bits(randn({100003}, a, {dtype}), randn({100003}, b, {dtype, Device::cuda()}),
                     fmt::format("randn {}", dtype_name(dtype)));
  }
}

TEST(cuda_backend_test, elementwise_ops_match_the_cpu_bit_for_bit_on_strided_and_broadcast_inputs) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    Generator gen(11);
    const Tensor x = mul(randn({64, 96}, gen, {dtype}), 300.0);
    const Tensor y = mul(randn({96}, gen, {dtype}), 300.0);
    const Tensor xt = x.transpose(0, 1);  // strided [96, 64]
    const Tensor x_gpu = x.to(Device::cuda()), y_gpu = y.to(Device::cuda());
    const Tensor xt_gpu = x_gpu.transpose(0, 1);
    const std::string d(dtype_name(dtype));
    expect_same_bits(add(x, y), add(x_gpu, y_gpu), "add " + d);
    expect_same_bits(sub(x, y), sub(x_gpu, y_gpu), "sub " + d);
    expect_same_bits(mul(x, y), mul(x_gpu, y_gpu), "mul " + d);
    expect_same_bits(div(x, y), div(x_gpu, y_gpu), "div " + d);
    expect_same_bits(add(x, 0.1), add(x_gpu, 0.1), "add scalar " + d);
    expect_same_bits(mul(x, 257.0), mul(x_gpu, 257.0), "mul scalar (overflows f16) " + d);
    expect_same_bits(div(x, 3.0), div(x_gpu, 3.0), "div scalar " + d);
    expect_same_bits(neg(xt), neg(xt_gpu), "neg strided " + d);
    expect_same_bits(relu(xt), relu(xt_gpu), "relu strided " + d);
    expect_same_bits(xt.contiguous(), xt_gpu.contiguous(), "contiguous " + d);
    expect_same_bits(full({5, 7}, 70000.0, {dtype}), full({5, 7}, 70000.0, {dtype, Device::cuda()}), "full " + d);
    expect_same_bits(arange(-3, 7, 0.5, {dtype}), arange(-3, 7, 0.5, {dtype, Device::cuda()}), "arange " + d);
  }
}

TEST(cuda_backend_test, special_values_give_the_same_bits_nans_included) {
  SKIP_WITHOUT_GPU();
  // Every pair of these through every binary op: infinities, NaNs with payloads and signs, signed zeros,
  // the edges of the f16 range. NaN results must be the canonical NaN on both sides.
  const double inf = INFINITY;
  const std::vector<double> special = {0.0, -0.0, 1.0, -1.0, inf, -inf, NAN, -NAN, 65504.0, 65520.0, 6e-8, 1e-45, 3e38};
  const std::int64_t n = static_cast<std::int64_t>(special.size());
  for (DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    const Tensor x = from_values(special, {n, 1}, {dtype}), y = from_values(special, {1, n}, {dtype});
    const Tensor xg = x.to(Device::cuda()), yg = y.to(Device::cuda());
    const std::string d(dtype_name(dtype));
    expect_same_bits(add(x, y), add(xg, yg), "add specials " + d);
    expect_same_bits(sub(x, y), sub(xg, yg), "sub specials " + d);
    expect_same_bits(mul(x, y), mul(xg, yg), "mul specials " + d);
    expect_same_bits(div(x, y), div(xg, yg), "div specials " + d);
    expect_same_bits(neg(x), neg(xg), "neg specials " + d);
    expect_same_bits(relu(x), relu(xg), "relu specials " + d);
  }
  // exp only where its result is exact (libm implementations may differ by an ulp elsewhere).
  const std::vector<double> exact = {0.0, -0.0, inf, -inf, NAN, -NAN, 65520.0, 3e38, -3e38};
  for (DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    const Tensor x = from_values(exact, {static_cast<std::int64_t>(exact.size())}, {dtype});
    expect_same_bits(exp(x), exp(x.to(Device::cuda())), fmt::format("exp specials {}", dtype_name(dtype)));
  }
}

TEST(cuda_backend_test, arange_with_an_inexact_step_matches_the_cpu_without_fused_multiply_add) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    expect_same_bits(arange(0.1, 1000.0, 0.1, {dtype}), arange(0.1, 1000.0, 0.1, {dtype, Device::cuda()}),
                     fmt::format("arange step 0.1 {}", dtype_name(dtype)));
  }
}

TEST(cuda_backend_test, exp_matches_the_cpu_within_one_unit_in_the_last_place) {
  SKIP_WITHOUT_GPU();
  // glibc's expf (under 1 ulp) and CUDA's expf (documented at 2 ulp) are different implementations, so
  // float results may differ by up to 3 ulp; allow 4. A rounded f16/bf16 result rarely differs by 1 ulp.
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    Generator gen(3);
    const Tensor x = mul(randn({100000}, gen, {dtype}), 4.0);
    const std::vector<double> a = exp(x).values(), b = exp(x.to(Device::cuda())).values();
    const double eps = dtype == DType::f32 ? 4 * 0x1p-23 : dtype == DType::f16 ? 0x1p-10 : 0x1p-7;
    int bad = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (std::fabs(a[i] - b[i]) > eps * std::fabs(a[i]) && bad++ < 5) {
        ADD_FAILURE() << dtype_name(dtype) << " exp element " << i << ": cpu " << a[i] << " cuda " << b[i];
      }
    }
  }
}

TEST(cuda_backend_test, mixing_devices_in_one_op_is_an_error_naming_both_devices) {
  SKIP_WITHOUT_GPU();
  const Tensor a = ones({2}), b = ones({2}, {DType::f32, Device::cuda()});
  try {
    add(a, b);
    FAIL() << "expected DeviceError";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("add: expected all tensors on the same device, got cpu and cuda:0"),
              std::string::npos)
        << e.what();
  }
}

TEST(cuda_backend_test, out_of_memory_says_how_much_was_asked_and_how_much_is_free) {
  SKIP_WITHOUT_GPU();
  try {
    Tensor::empty({std::int64_t{1} << 48}, {DType::f32, Device::cuda()});  // 1 PiB
    FAIL() << "expected DeviceRuntimeError";
  } catch (const DeviceRuntimeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cuda:0: out of memory: asked for 1125899906842624 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("MiB free of"), std::string::npos) << msg;
  }
  // The device is still usable afterwards.
  EXPECT_EQ(add(ones({3}, {DType::f32, Device::cuda()}), 1.0).values(), (std::vector<double>{2, 2, 2}));
}

TEST(cuda_backend_test, a_cuda_device_beyond_the_count_is_refused_with_the_count) {
  SKIP_WITHOUT_GPU();
  const int n = cuda_status().device_count;
  try {
    backend_for(Device::cuda(n));
    FAIL() << "expected DeviceError";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("{} CUDA device(s) found", n)), std::string::npos) << e.what();
  }
}

TEST(cuda_backend_test, without_a_gpu_cuda_tensors_are_refused_with_the_reason) {
  if (cuda_status().device_count > 0) GTEST_SKIP() << "a GPU is present; this checks the GPU-less error";
  try {
    ones({2}, {DType::f32, Device::cuda()});
    FAIL() << "expected DeviceError";
  } catch (const DeviceError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("device 'cuda:0' is not available: "), std::string::npos) << msg;
    EXPECT_NE(msg.find("hint: use device 'cpu'"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace ampscope
