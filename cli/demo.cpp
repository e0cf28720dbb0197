#include "cli/demo.h"

#include <cstring>

#include <fmt/format.h>

#include "core/error.h"
#include "core/format.h"
#include "core/ops.h"
#include "core/random.h"

namespace ampscope {

namespace {

void section(std::string_view title) { fmt::print("\n== {} ==\n", title); }

// Rounds a few telling values to f16 and bf16 and says what happened to each.
void show_rounding(Device device) {
  section("FP32 values stored as FP16 and BF16 (IEEE round-to-nearest-even)");
  const std::vector<double> values = {1.0, 0.1, 65504.0, 65519.0, 65520.0, 70000.0, 6.0e-5, 1.0e-7, 2.0e-8, 3.0e38};
  const Tensor f32 = from_values(values, {static_cast<std::int64_t>(values.size())}, {DType::f32, device});
  const Tensor f16_host = f32.to(DType::f16).to(Device::cpu());
  const std::vector<double> as_f16 = f16_host.values();
  const std::vector<double> as_bf16 = f32.to(DType::bf16).values();
  fmt::print("{:>14}  {:>16}  {:>8}  {:>16}\n", "f32 input", "as f16", "f16 bits", "as bf16");
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float x = static_cast<float>(values[i]);
    const std::uint16_t bits = static_cast<const f16*>(f16_host.data())[i].bits;
    std::string note;
    if (std::isinf(as_f16[i])) note = "f16 overflow -> inf";
    else if (as_f16[i] == 0) note = "f16 underflow -> 0";
    else if (std::fabs(as_f16[i]) < kF16MinNormal) note = "f16 subnormal";
    fmt::print("{:>14}  {:>16}  {:#06x}  {:>16}  {}\n", format_value(x, DType::f32), format_value(as_f16[i], DType::f16),
               bits, format_value(as_bf16[i], DType::bf16), note);
  }
}

void show_views(Device device) {
  section("Views share storage");
  const Tensor x = arange(12, {DType::f16, device}).reshape({3, 4});
  fmt::print("x = arange(12).reshape({{3, 4}}):\n{}\n", x);
  const Tensor t = x.transpose(0, 1);
  fmt::print("x.transpose(0, 1), strides [{}, {}], same storage: {}\n{}\n", t.strides()[0], t.strides()[1],
             t.shares_storage_with(x), t);
  fmt::print("x.slice(1, 1, 4, 2):\n{}\n", x.slice(1, 1, 4, 2));
}

void show_arithmetic(Device device) {
  section("Arithmetic: computed in float, rounded once to the storage dtype");
  const Tensor a = from_values({30000, 40000, 50000}, {3, 1}, {DType::f16, device});
  const Tensor b = from_values({20000, 30000}, {2}, {DType::f16, device});
  fmt::print("a ([3, 1], f16) + b ([2], f16) broadcasts to [3, 2]; sums above 65504 overflow in f16:\n{}\n",
             add(a, b));
  fmt::print("the same in f32:\n{}\n", add(a.to(DType::f32), b.to(DType::f32)));
  fmt::print("f16 * 0.1 uses the float 0.1f, not f16(0.1):\n{}\n", mul(b, 0.1));
}

void show_random(Device device, unsigned long long seed) {
  section(fmt::format("Seeded random tensors (Philox 4x32-10, seed {})", seed));
  Generator gen(seed);
  fmt::print("rand({{2, 4}}):\n{}\n", rand({2, 4}, gen, {DType::f32, device}));
  fmt::print("randn({{2, 4}}, f16):\n{}\n", randn({2, 4}, gen, {DType::f16, device}));
}

// The CUDA backend must store the same bits as the CPU backend for the same inputs.
bool cross_check_cuda(unsigned long long seed) {
  section("CUDA backend against the CPU backend");
  bool ok = true;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    Generator g_cpu(seed), g_gpu(seed);
    const Tensor x_cpu = mul(randn({4096}, g_cpu, {dtype, Device::cpu()}), 3000.0);
    const Tensor x_gpu = mul(randn({4096}, g_gpu, {dtype, Device::cuda()}), 3000.0);
    const Tensor y_cpu = exp(div(add(x_cpu, x_cpu), 1000.0));
    const Tensor y_gpu = exp(div(add(x_gpu, x_gpu), 1000.0)).to(Device::cpu());
    const Tensor x_back = x_gpu.to(Device::cpu());
    const bool random_same = std::memcmp(x_back.data(), x_cpu.data(), x_cpu.numel() * dtype_size(dtype)) == 0;
    // exp comes from two different libm implementations (glibc, CUDA); allow them to differ in the last
    // bit of the f32 result. Everything else must match bit for bit.
    const std::vector<double> a = y_cpu.values(), b = y_gpu.values();
    std::size_t differ = 0;
    for (std::size_t i = 0; i < a.size(); ++i) differ += !(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])));
    fmt::print("{:>5}: randn*3000 identical bits: {}; exp(2x/1000) elements that differ: {} of {}\n", dtype_name(dtype),
               random_same ? "yes" : "NO", differ, a.size());
    ok = ok && random_same;
  }
  return ok;
}

}  // namespace

int run_demo(const DemoOptions& options) {
  const CudaStatus cuda = cuda_status();
  Device device = Device::cpu();
  if (options.device == "cuda" || (options.device == "auto" && cuda.device_count > 0)) {
    device = Device::cuda();
  } else if (options.device != "cpu" && options.device != "auto") {
    device = Device::parse(options.device);  // throws with the valid forms
  }
  backend_for(device);  // throws, with the reason, when the device is not there

  fmt::print("ampscope demo: tensors and backends\n");
  fmt::print("backends: cpu (always)");
  if (cuda.device_count > 0) {
    fmt::print(", cuda ({} device(s))\n", cuda.device_count);
  } else {
    fmt::print("; cuda not available: {}\n", cuda.reason);
  }
  fmt::print("running on: {}\n", device.str());

  show_rounding(device);
  show_views(device);
  show_arithmetic(device);
  show_random(device, options.seed);

  section("What each backend implements");
  const Backend& be = backend_for(device);
  for (Op op : {Op::add, Op::exp, Op::uniform, Op::arange}) {
    std::string row = fmt::format("{:>8}:", op_name(op));
    for (int t = 0; t < kNumDTypes; ++t) {
      const DType d = static_cast<DType>(t);
      row += fmt::format(" {}={}", dtype_name(d), be.supports(op, d) ? "yes" : "no");
    }
    fmt::print("{}\n", row);
  }
  try {
    neg(arange(3, {DType::i64, device}));
  } catch (const UnsupportedError& e) {
    fmt::print("asking for a missing kernel is a clean error: {}\n", e.what());
  }

  if (device.is_cuda()) return cross_check_cuda(options.seed) ? 0 : 1;
  return 0;
}

}  // namespace ampscope
