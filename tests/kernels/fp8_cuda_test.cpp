// tests/kernels/fp8_cuda_test.cpp: the CUDA FP8 kernels (kernels/cuda/fp8_cuda.h) against the CPU's FP8 code
// (core/float8.h, core/fp8_linear.cpp), which tests/core/float8_test.cpp and fp8_linear_test.cpp check against
// independent references. On the GPU:
// - every f16 and bf16 value, and 2^24 f32 bit patterns spread over the whole range, encode to the CPU's code
//   (both formats, both overflow rules), and to the GPU's own cvt.rn.satfinite where the device has FP8;
// - the 256 codes of each format decode to the CPU's float, bit for bit;
// - scaled quantization of strided f32/bf16 operands with NaN, inf and -0 gives the CPU's codes and amax;
// - the exact GEMM kernel gives the CPU's fp8_gemm bits (fprop, dgrad and wgrad layouts, f32 and bf16 outputs,
//   with and without bias); cuBLASLt's FP8 GEMM lies within fp8_cublaslt_bound of them;
// - an FP8 MLP (delayed scaling, three steps) gives the CPU's loss, gradients, amax histories and scales bit
//   for bit where its GEMMs run the exact kernel.
// Everything skips, saying why, where there is no GPU (SKIP_WITHOUT_GPU; AMPSCOPE_REQUIRE_GPU=1 fails instead).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/autocast.h"
#include "core/backend.h"
#include "core/float16.h"
#include "core/float8.h"
#include "core/fp8_linear.h"
#include "core/fp8_recipe.h"
#include "core/nn.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"
#include "tests/test_support.h"
#if defined(AMPSCOPE_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "kernels/cuda/fp8_cuda.h"
#include "kernels/cuda/fp8_launch.h"
#endif

namespace ampscope {
namespace {

// The dispatch (core/fp8_linear.cpp to core/fp8_linear_device.cpp) without a GPU: operands quantized on two
// devices are refused, naming both, before any kernel or device memory is touched.
TEST(fp8_cuda_test, a_gemm_of_operands_on_two_devices_is_refused) {
  Fp8Quantized a, b;
  a.rows = 2;
  a.cols = 3;
  a.codes.assign(6, 0x38);  // 1.0 in E4M3
  b = a;
  b.rows = 3;
  b.cols = 2;
  b.device = Device::cuda(0);
  b.codes.clear();
  EXPECT_THROW_MSG(fp8_gemm(a, false, b, false, DType::f32), DeviceError, "fp8_gemm: the operands are on cpu and cuda:0",
                   "hint: quantize both on one device");
}

#if defined(AMPSCOPE_WITH_CUDA)

// Device bytes owned for the test's duration.
struct DeviceBuffer {
  Backend& backend;
  std::size_t bytes;
  void* ptr;
  DeviceBuffer(Backend& be, std::size_t n) : backend(be), bytes(n == 0 ? 1 : n), ptr(be.allocate(bytes)) {}
  ~DeviceBuffer() { backend.deallocate(ptr, bytes); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(ptr); }
};

Backend& gpu() { return backend_for(Device::cuda(0)); }

// Runs a launcher on this thread's default stream after the backend's work, and waits for it.
template <class Launch>
void run_launch(Launch&& launch) {
  gpu().synchronize();
  ASSERT_EQ(launch(cudaStreamPerThread), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
}

int device_compute_capability() {
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  return major * 10 + minor;
}

// The codes of `values` (a CPU tensor of any floating dtype) encoded on the GPU with scale 1.
std::vector<std::uint8_t> gpu_encode(const Tensor& values, Fp8Format format, Fp8Overflow overflow) {
  const Tensor d = values.to(Device::cuda(0));
  const std::size_t n = static_cast<std::size_t>(d.numel());
  DeviceBuffer codes(gpu(), n);
  run_launch([&](cudaStream_t s) {
    return cuda::launch_fp8_quantize(d.kernel_view(), 1.0f, format, Fp8Overflow(overflow), codes.as<std::uint8_t>(),
                                     nullptr, s);
  });
  std::vector<std::uint8_t> out(n);
  gpu().copy_to_host(out.data(), codes.ptr, n);
  return out;
}

// Every 16-bit pattern as a CPU tensor of dtype t (f16 or bf16).
Tensor all_16_bit_values(DType t) {
  Tensor x = Tensor::empty({65536}, {t, Device::cpu()});
  auto* bits = static_cast<std::uint16_t*>(x.data());
  for (std::uint32_t i = 0; i < 65536; ++i) bits[i] = static_cast<std::uint16_t>(i);
  return x;
}

const char* name_of(Fp8Format f) { return f == Fp8Format::e4m3 ? "e4m3" : "e5m2"; }

TEST(fp8_cuda_test, every_f16_and_bf16_value_encodes_to_the_cpus_code) {
  SKIP_WITHOUT_GPU();
  for (DType t : {DType::f16, DType::bf16}) {
    const Tensor x = all_16_bit_values(t);
    const auto* bits = static_cast<const std::uint16_t*>(x.data());
    for (Fp8Format format : {Fp8Format::e4m3, Fp8Format::e5m2}) {
      for (Fp8Overflow overflow : {Fp8Overflow::satfinite, Fp8Overflow::torch}) {
        const std::vector<std::uint8_t> got = gpu_encode(x, format, overflow);
        int mismatches = 0;
        for (std::uint32_t i = 0; i < 65536; ++i) {
          const float v = t == DType::f16 ? detail::f16_bits_to_float(bits[i]) : detail::bf16_bits_to_float(bits[i]);
          const std::uint8_t want = float_to_fp8(v, format, overflow);
          if (got[i] != want && ++mismatches <= 5) {
            ADD_FAILURE() << dtype_name(t) << " 0x" << std::hex << i << " -> " << name_of(format)
                          << (overflow == Fp8Overflow::satfinite ? " satfinite" : " torch") << ": GPU 0x"
                          << int(got[i]) << ", CPU 0x" << int(want);
          }
        }
        EXPECT_EQ(mismatches, 0);
      }
    }
  }
}

// f32 bit patterns i * 257 (mod 2^32) for i < 2^24: every exponent, sign and many mantissas, NaNs and infs.
std::vector<float> spread_f32() {
  std::vector<float> v(std::size_t{1} << 24);
  for (std::uint32_t i = 0; i < v.size(); ++i) v[i] = detail::bits_float(i * 257u);
  return v;
}

TEST(fp8_cuda_test, f32_patterns_over_the_whole_range_encode_to_the_cpus_code) {
  SKIP_WITHOUT_GPU();
  const std::vector<float> v = spread_f32();
  Tensor xt = Tensor::empty({static_cast<std::int64_t>(v.size())}, {DType::f32, Device::cpu()});
  std::memcpy(xt.data(), v.data(), v.size() * sizeof(float));
  for (Fp8Format format : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    const std::vector<std::uint8_t> got = gpu_encode(xt, format, Fp8Overflow::satfinite);
    int mismatches = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      const std::uint8_t want = float_to_fp8(v[i], format);
      if (got[i] != want && ++mismatches <= 5) {
        ADD_FAILURE() << "f32 0x" << std::hex << detail::float_bits(v[i]) << " -> " << name_of(format) << ": GPU 0x"
                      << int(got[i]) << ", CPU 0x" << int(want);
      }
    }
    EXPECT_EQ(mismatches, 0) << name_of(format);
  }
}

// core/float8.h's header says it follows cuda_fp8.h's satfinite conversion; on a device with FP8 that is the
// cvt.rn.satfinite instruction TransformerEngine's casts run. Every f16 and bf16 value and the f32 spread.
TEST(fp8_cuda_test, the_runtime_encoding_is_the_gpus_cvt_rn_satfinite) {
  SKIP_WITHOUT_GPU();
  if (device_compute_capability() < 89) {
    GTEST_SKIP() << "the device has no FP8 conversion instruction (compute capability "
                 << device_compute_capability() << " < 8.9)";
  }
  std::vector<float> v = spread_f32();
  for (std::uint32_t i = 0; i < 65536; ++i) {
    v.push_back(detail::f16_bits_to_float(static_cast<std::uint16_t>(i)));
    v.push_back(detail::bf16_bits_to_float(static_cast<std::uint16_t>(i)));
  }
  DeviceBuffer in(gpu(), v.size() * sizeof(float));
  DeviceBuffer codes(gpu(), v.size());
  gpu().copy_from_host(in.ptr, v.data(), v.size() * sizeof(float));
  for (Fp8Format format : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    run_launch([&](cudaStream_t s) {
      return cuda::launch_fp8_encode_hardware(in.as<float>(), static_cast<std::int64_t>(v.size()), format,
                                              codes.as<std::uint8_t>(), s);
    });
    std::vector<std::uint8_t> got(v.size());
    gpu().copy_to_host(got.data(), codes.ptr, v.size());
    int mismatches = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      const std::uint8_t want = float_to_fp8(v[i], format);
      if (got[i] != want && ++mismatches <= 5) {
        ADD_FAILURE() << "f32 0x" << std::hex << detail::float_bits(v[i]) << " -> " << name_of(format)
                      << ": cvt.rn.satfinite 0x" << int(got[i]) << ", core/float8.h 0x" << int(want);
      }
    }
    EXPECT_EQ(mismatches, 0) << name_of(format);
  }
}

TEST(fp8_cuda_test, the_256_codes_decode_to_the_cpus_floats) {
  SKIP_WITHOUT_GPU();
  std::vector<std::uint8_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[static_cast<std::size_t>(c)] = static_cast<std::uint8_t>(c);
  DeviceBuffer in(gpu(), 256);
  DeviceBuffer out(gpu(), 256 * sizeof(float));
  gpu().copy_from_host(in.ptr, codes.data(), 256);
  for (Fp8Format format : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    run_launch([&](cudaStream_t s) {
      return cuda::launch_fp8_decode(in.as<std::uint8_t>(), 256, format, out.as<float>(), s);
    });
    std::vector<float> got(256);
    gpu().copy_to_host(got.data(), out.ptr, 256 * sizeof(float));
    for (int c = 0; c < 256; ++c) {
      EXPECT_EQ(detail::float_bits(got[static_cast<std::size_t>(c)]),
                detail::float_bits(fp8_to_float(static_cast<std::uint8_t>(c), format)))
          << name_of(format) << " code 0x" << std::hex << c;
    }
  }
}

// A [rows, cols] matrix of normal values over many binades, with NaN, +-inf, -0, values past 448 and below the
// E5M2 subnormals planted.
Tensor test_matrix(std::int64_t rows, std::int64_t cols, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  std::uniform_int_distribution<int> binade(-20, 12);
  std::vector<double> v(static_cast<std::size_t>(rows * cols));
  for (double& x : v) x = std::ldexp(normal(rng), binade(rng));
  const double specials[] = {std::nan(""), INFINITY, -INFINITY, -0.0, 500.0, -70000.0, 1e-9, 464.0};
  for (std::size_t k = 0; k < std::size(specials) && k * 13 < v.size(); ++k) v[k * 13] = specials[k];
  return from_values(v, {rows, cols});
}

TEST(fp8_cuda_test, quantizing_strided_operands_gives_the_cpus_codes_amax_and_scales) {
  SKIP_WITHOUT_GPU();
  for (DType t : {DType::f32, DType::bf16}) {
    for (Fp8Recipe recipe : {Fp8Recipe::current, Fp8Recipe::delayed}) {
      for (Fp8Operand operand : {Fp8Operand::input, Fp8Operand::grad_output}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + (recipe == Fp8Recipe::current ? " current " : " delayed ") +
                     std::string(fp8_operand_name(operand)));
        // A transposed view: the kernel reads through the strides.
        const Tensor cpu = test_matrix(37, 53, 11).to(t).transpose(0, 1);
        const Fp8Options options{.recipe = recipe};
        Fp8LinearState cpu_state{make_delayed_scaling_state(options.delayed), make_delayed_scaling_state(options.delayed),
                                 make_delayed_scaling_state(options.delayed)};
        cpu_state.operand(operand).scale = 0.375f;  // a scale the delayed recipe would have computed
        cpu_state.operand(operand).scale_inv = 1.0f / 0.375f;
        Fp8LinearState gpu_state = cpu_state;
        const Fp8Quantized want = fp8_quantize_operand(cpu, operand, options, &cpu_state);
        const Fp8Quantized got = fp8_quantize_operand(cpu.to(Device::cuda(0)), operand, options, &gpu_state);
        ASSERT_TRUE(got.device.is_cuda());
        ASSERT_NE(got.device_codes, nullptr);
        std::vector<std::uint8_t> codes(want.codes.size());
        gpu().copy_to_host(codes.data(), got.device_codes.get(), codes.size());
        EXPECT_EQ(codes, want.codes);
        EXPECT_EQ(detail::float_bits(got.amax), detail::float_bits(want.amax));
        EXPECT_EQ(detail::float_bits(got.scale), detail::float_bits(want.scale));
        EXPECT_EQ(detail::float_bits(got.scale_inv), detail::float_bits(want.scale_inv));
        EXPECT_EQ(got.format, want.format);
        EXPECT_EQ(gpu_state.operand(operand).amax_history, cpu_state.operand(operand).amax_history);
      }
    }
  }
}

// Random codes without NaN, as the operands of a GEMM, on the CPU and the GPU.
struct GemmOperands {
  Fp8Quantized cpu, gpu;
};
GemmOperands random_operand(std::int64_t rows, std::int64_t cols, Fp8Format format, float scale_inv, std::mt19937& rng,
                            std::shared_ptr<DeviceBuffer>& keep) {
  std::uniform_int_distribution<int> code(0, 255);
  GemmOperands o;
  o.cpu.rows = o.gpu.rows = rows;
  o.cpu.cols = o.gpu.cols = cols;
  o.cpu.format = o.gpu.format = format;
  o.cpu.scale_inv = o.gpu.scale_inv = scale_inv;
  o.cpu.scale = o.gpu.scale = 1.0f / scale_inv;
  o.cpu.codes.resize(static_cast<std::size_t>(rows * cols));
  for (std::uint8_t& c : o.cpu.codes) {
    do {
      c = static_cast<std::uint8_t>(code(rng));
    } while (std::isnan(fp8_to_float(c, format)) || std::isinf(fp8_to_float(c, format)));
  }
  keep = std::make_shared<DeviceBuffer>(gpu(), o.cpu.codes.size());
  gpu().copy_from_host(keep->ptr, o.cpu.codes.data(), o.cpu.codes.size());
  o.gpu.device = Device::cuda(0);
  o.gpu.device_codes = std::shared_ptr<const std::uint8_t>(keep, keep->as<std::uint8_t>());
  return o;
}

struct GemmCase {
  const char* name;
  bool transpose_a, transpose_b;
  Fp8Format a_format, b_format;
};
// fprop Q(x) Q(W)^T, dgrad Q(dy) Q(W), wgrad Q(dy)^T Q(x), with HYBRID's formats.
const GemmCase kGemms[] = {{"fprop", false, true, Fp8Format::e4m3, Fp8Format::e4m3},
                           {"dgrad", false, false, Fp8Format::e5m2, Fp8Format::e4m3},
                           {"wgrad", true, false, Fp8Format::e5m2, Fp8Format::e4m3}};

// alpha * sum_p |op(A)[i][p] op(B)[p][j]| in double, for each output.
std::vector<double> abs_product_sums(const Fp8Quantized& a, bool ta, const Fp8Quantized& b, bool tb) {
  const std::int64_t I = ta ? a.cols : a.rows, P = ta ? a.rows : a.cols, J = tb ? b.rows : b.cols;
  const double alpha = static_cast<double>(a.scale_inv * b.scale_inv);
  std::vector<double> s(static_cast<std::size_t>(I * J));
  for (std::int64_t i = 0; i < I; ++i)
    for (std::int64_t j = 0; j < J; ++j) {
      double acc = 0;
      for (std::int64_t p = 0; p < P; ++p) {
        const std::uint8_t ca = a.codes[static_cast<std::size_t>(ta ? p * a.cols + i : i * a.cols + p)];
        const std::uint8_t cb = b.codes[static_cast<std::size_t>(tb ? j * b.cols + p : p * b.cols + j)];
        acc += std::fabs(static_cast<double>(fp8_to_float(ca, a.format)) * fp8_to_float(cb, b.format));
      }
      s[static_cast<std::size_t>(i * J + j)] = alpha * acc;
    }
  return s;
}

void expect_bits_equal(const Tensor& got, const Tensor& want, const std::string& what) {
  const std::vector<double> g = got.to(Device::cpu()).values(), w = want.values();
  ASSERT_EQ(g.size(), w.size()) << what;
  int mismatches = 0;
  for (std::size_t k = 0; k < g.size(); ++k) {
    if (std::memcmp(&g[k], &w[k], sizeof(double)) != 0 && ++mismatches <= 5) {
      ADD_FAILURE() << what << " element " << k << ": GPU " << g[k] << ", CPU " << w[k];
    }
  }
  EXPECT_EQ(mismatches, 0) << what;
}

TEST(fp8_cuda_test, the_exact_gemm_kernel_gives_the_cpus_bits_in_every_layout) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(2024);
  // (I, P, J): unaligned sizes (the exact kernel is what fp8_gemm runs for them) and aligned ones (run here
  // through the launcher, since fp8_gemm would pick cuBLASLt).
  const std::int64_t shapes[][3] = {{5, 24, 7}, {1, 1, 1}, {48, 64, 32}, {17, 300, 9}};
  for (const auto& shape : shapes) {
    const std::int64_t I = shape[0], P = shape[1], J = shape[2];
    for (const GemmCase& c : kGemms) {
      std::shared_ptr<DeviceBuffer> ka, kb;
      const GemmOperands a = c.transpose_a ? random_operand(P, I, c.a_format, 0.0625f, rng, ka)
                                           : random_operand(I, P, c.a_format, 0.0625f, rng, ka);
      const GemmOperands b = c.transpose_b ? random_operand(J, P, c.b_format, 3.0f, rng, kb)
                                           : random_operand(P, J, c.b_format, 3.0f, rng, kb);
      const Tensor bias = from_values(std::vector<double>(static_cast<std::size_t>(J), 0.5), {J}).to(DType::bf16);
      for (DType out : {DType::f32, DType::bf16}) {
        for (bool with_bias : {false, true}) {
          const std::string what = std::string(c.name) + " " + std::to_string(I) + "x" + std::to_string(P) + "x" +
                                   std::to_string(J) + " " + std::string(dtype_name(out)) + (with_bias ? " +bias" : "");
          const Tensor want = fp8_gemm(a.cpu, c.transpose_a, b.cpu, c.transpose_b, out, with_bias ? bias : Tensor());
          Tensor got = Tensor::empty({I, J}, {out, Device::cuda(0)});
          const Tensor bias_gpu = bias.to(DType::f32).to(Device::cuda(0));
          Fp8GemmArgs g;
          g.a = a.gpu.device_codes.get();
          g.a_rows = a.gpu.rows;
          g.a_cols = a.gpu.cols;
          g.a_format = c.a_format;
          g.transpose_a = c.transpose_a;
          g.b = b.gpu.device_codes.get();
          g.b_rows = b.gpu.rows;
          g.b_cols = b.gpu.cols;
          g.b_format = c.b_format;
          g.transpose_b = c.transpose_b;
          g.alpha = a.cpu.scale_inv * b.cpu.scale_inv;
          if (with_bias) g.bias = bias_gpu.kernel_view();
          g.out = got.kernel_view();
          run_launch([&](cudaStream_t s) { return cuda::launch_fp8_gemm_exact(g, s); });
          expect_bits_equal(got, want, what);
          if (!cuda::fp8_gemm_uses_cublaslt(g, 0)) {  // what the runtime runs: the same bits
            const std::uint64_t before = cuda::fp8_gemm_exact_count();
            expect_bits_equal(fp8_gemm(a.gpu, c.transpose_a, b.gpu, c.transpose_b, out, with_bias ? bias.to(Device::cuda(0)) : Tensor()),
                              want, what + " through fp8_gemm");
            EXPECT_EQ(cuda::fp8_gemm_exact_count(), before + 1) << what;
          }
        }
      }
    }
  }
}

TEST(fp8_cuda_test, cublaslt_fp8_gemms_lie_within_the_documented_bound_of_the_cpus) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(99);
  const std::int64_t I = 64, P = 4096, J = 48;  // a long inner sum: where accumulation differences show
  bool ran = false;
  for (const GemmCase& c : kGemms) {
    std::shared_ptr<DeviceBuffer> ka, kb;
    const GemmOperands a = c.transpose_a ? random_operand(P, I, c.a_format, 0.125f, rng, ka)
                                         : random_operand(I, P, c.a_format, 0.125f, rng, ka);
    const GemmOperands b = c.transpose_b ? random_operand(J, P, c.b_format, 0.5f, rng, kb)
                                         : random_operand(P, J, c.b_format, 0.5f, rng, kb);
    Fp8GemmArgs probe;
    probe.a_rows = a.gpu.rows;
    probe.a_cols = a.gpu.cols;
    probe.a_format = c.a_format;
    probe.transpose_a = c.transpose_a;
    probe.b_rows = b.gpu.rows;
    probe.b_cols = b.gpu.cols;
    probe.b_format = c.b_format;
    probe.transpose_b = c.transpose_b;
    probe.out.dtype = DType::f32;
    if (!cuda::fp8_gemm_uses_cublaslt(probe, 0)) continue;
    const std::vector<double> sums = abs_product_sums(a.cpu, c.transpose_a, b.cpu, c.transpose_b);
    for (DType out : {DType::f32, DType::bf16}) {
      const std::uint64_t before = cuda::fp8_gemm_cublaslt_count();
      const std::vector<double> got = fp8_gemm(a.gpu, c.transpose_a, b.gpu, c.transpose_b, out).to(Device::cpu()).values();
      if (cuda::fp8_gemm_cublaslt_count() != before + 1) continue;  // cuBLASLt offered no algorithm
      ran = true;
      const std::vector<double> want = fp8_gemm(a.cpu, c.transpose_a, b.cpu, c.transpose_b, out).values();
      double worst = 0;
      for (std::size_t k = 0; k < got.size(); ++k) {
        double bound = cuda::fp8_cublaslt_bound(sums[k], P);
        // A bf16 output: each side rounded once more, so up to one bf16 ulp (2^-7 relative) apart on top.
        if (out == DType::bf16) bound += std::ldexp(std::fabs(want[k]) + bound, -7);
        const double diff = std::fabs(got[k] - want[k]);
        worst = std::max(worst, diff / bound);
        EXPECT_LE(diff, bound) << c.name << " " << dtype_name(out) << " element " << k;
      }
      std::printf("fp8 cuBLASLt %s %s: worst |GPU - CPU| / bound = %.3g\n", c.name, std::string(dtype_name(out)).c_str(),
                  worst);
    }
  }
  if (!ran) GTEST_SKIP() << "cuBLASLt's FP8 GEMM is not available on this device (compute capability < 8.9, or no algorithm)";
}

// A two-layer MLP under bf16 autocast and FP8 (delayed scaling, HYBRID), three steps with an SGD update, on
// the CPU and on the GPU from the same weights and inputs. Sizes not multiples of 16, so every GEMM runs the
// exact kernel: the losses, gradients, amax histories and scales must be the CPU's bits.
TEST(fp8_cuda_test, an_fp8_mlp_step_on_the_gpu_gives_the_cpus_bits) {
  SKIP_WITHOUT_GPU();
  const std::int64_t batch = 6, in = 24, hidden = 40, out = 10;
  Generator gen(31);
  auto build = [&](Generator& g) {
    auto model = std::make_shared<nn::Sequential>();
    model->push_back(std::make_shared<nn::Linear>(in, hidden, g));
    model->push_back(std::make_shared<nn::ReLU>());
    model->push_back(std::make_shared<nn::Linear>(hidden, out, g));
    return model;
  };
  Generator g1(7), g2(7);
  auto cpu_model = build(g1);
  auto gpu_model = build(g2);
  gpu_model->to(Device::cuda(0));
  const Fp8Options options{.recipe = Fp8Recipe::delayed, .delayed = {.history_len = 4}};
  auto cpu_fp8 = std::make_shared<Fp8Context>(options);
  auto gpu_fp8 = std::make_shared<Fp8Context>(options);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const Tensor x = randn({batch, in}, gen);
    const Tensor target = randn({batch, out}, gen);
    std::vector<double> losses;
    for (bool on_gpu : {false, true}) {
      auto& model = on_gpu ? gpu_model : cpu_model;
      auto& fp8 = on_gpu ? gpu_fp8 : cpu_fp8;
      const Device d = on_gpu ? Device::cuda(0) : Device::cpu();
      model->zero_grad();
      Tensor loss;
      {
        AutocastGuard autocast(DType::bf16);
        Fp8Guard region(fp8);
        loss = mse_loss((*model)(x.to(d)).to(DType::f32), target.to(d));
      }
      loss.backward();
      fp8->end_step();
      losses.push_back(loss.to(Device::cpu()).values()[0]);
    }
    EXPECT_EQ(losses[0], losses[1]);
    const auto cpu_params = cpu_model->named_parameters();
    const auto gpu_params = gpu_model->named_parameters();
    ASSERT_EQ(cpu_params.size(), gpu_params.size());
    for (std::size_t k = 0; k < cpu_params.size(); ++k) {
      expect_bits_equal(gpu_params[k].second.grad(), cpu_params[k].second.grad(), "grad of " + cpu_params[k].first);
    }
    ASSERT_EQ(cpu_fp8->states().size(), gpu_fp8->states().size());
    for (const auto& [module, cs] : cpu_fp8->states()) {
      const Fp8LinearState& gs = gpu_fp8->states().at(module);
      for (Fp8Operand o : {Fp8Operand::input, Fp8Operand::weight, Fp8Operand::grad_output}) {
        EXPECT_EQ(gs.operand(o).amax_history, cs.operand(o).amax_history) << module << " " << fp8_operand_name(o);
        EXPECT_EQ(detail::float_bits(gs.operand(o).scale), detail::float_bits(cs.operand(o).scale)) << module;
      }
    }
    // SGD, the same on both: w -= 0.1 * grad, in f32.
    for (auto* m : {cpu_model.get(), gpu_model.get()}) {
      NoGradGuard no_grad;
      for (auto& [name, p] : m->named_parameters()) p.copy_(sub(p, mul(p.grad(), 0.1)));
    }
  }
  EXPECT_FALSE(cpu_fp8->states().empty());
}

#else
TEST(fp8_cuda_test, needs_a_cuda_build) { GTEST_SKIP() << "this build has no CUDA backend"; }
#endif  // AMPSCOPE_WITH_CUDA

}  // namespace
}  // namespace ampscope
