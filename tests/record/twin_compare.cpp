// twin_compare: probe::compare() (probes/twin.h) on two arrays from files, printed as JSON, so that
// tests/record/twin_test.py can check that the PyTorch recorder's twin (python/ampscope/torch/_twin.py)
// computes the same error measures as the runtime's twin on the same values.
// Usage: twin_compare DTYPE OP VALUE.f32 REFERENCE.f32: each file holds float32 values (native byte order);
// the value is converted to DTYPE (f16, bf16, f32; the test writes values DTYPE holds exactly).
//        twin_compare --ops X.f32 W.f32 B.f32 GAMMA.f32 BETA.f32 ROWS IN OUT: tests/record/scripts/twin_ops.py's
// forward (linear, x * 4, softmax, layer_norm) on the same bf16 values run by our runtime under probe::Twin;
// prints the twin's forward rows, one JSON object per line.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "probes/probe.h"
#include "probes/twin.h"

namespace {
std::vector<float> read_floats(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ampscope::Error(std::string("cannot read '") + path + "'");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() % sizeof(float) != 0) throw ampscope::Error(std::string("'") + path + "' is not float32 values");
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

ampscope::Tensor tensor_of(const std::vector<float>& v) {
  ampscope::Tensor t = ampscope::Tensor::empty({static_cast<std::int64_t>(v.size())},
                                               ampscope::TensorOptions{.dtype = ampscope::DType::f32});
  std::memcpy(t.data(), v.data(), v.size() * sizeof(float));
  return t;
}
struct NullSink : ampscope::trace::Sink {
  void write(const ampscope::trace::StepRow&) override {}
  void write(const ampscope::trace::OpRow&) override {}
  void write(const ampscope::trace::GradRow&) override {}
  void write(const ampscope::trace::EventRow&) override {}
  void write(const ampscope::trace::HistogramRow&) override {}
  void write(const ampscope::trace::DumpRow&) override {}
};

ampscope::Tensor bf16_of(const char* path, const ampscope::Shape& shape) {
  const std::vector<float> v = read_floats(path);
  return tensor_of(v).reshape(shape).to(ampscope::DType::bf16);
}

int run_ops(char** argv) {
  using namespace ampscope;
  const std::int64_t rows = std::stoll(argv[7]), in = std::stoll(argv[8]), out = std::stoll(argv[9]);
  const Tensor x = bf16_of(argv[2], {rows, in}), w = bf16_of(argv[3], {out, in}), b = bf16_of(argv[4], {out});
  const Tensor gamma = bf16_of(argv[5], {out}), beta = bf16_of(argv[6], {out});
  auto twin = std::make_shared<probe::Twin>(std::make_shared<probe::Probe>(std::make_shared<NullSink>()),
                                            probe::TwinOptions{.backward = false});
  {
    probe::HookGuard installed(twin);
    probe::StepScope step(0);
    const Tensor h = linear(x, w, b);
    const Tensor p = softmax(mul(h, 4.0), -1);
    const Tensor y = layer_norm(p, {out}, gamma, beta);
    step.end({});
  }
  for (const probe::PrecisionRow& r : twin->rows()) {
    std::printf("{\"op\": \"%s\", \"out_dtype\": \"%s\", \"local_max_rel\": %.17g, \"local_mean_rel\": %.17g, "
                "\"local_max_ulp\": %.17g, \"acc_max_rel\": %.17g, \"acc_mean_rel\": %.17g, \"acc_max_ulp\": %.17g, "
                "\"in_acc_max_rel\": %.17g, \"in_acc_mean_rel\": %.17g, \"flips\": %lld, \"exact\": %lld}\n",
                r.op.c_str(), r.out_dtype.c_str(), r.local_max_rel, r.local_mean_rel, r.local_max_ulp, r.acc_max_rel,
                r.acc_mean_rel, r.acc_max_ulp, r.in_acc_max_rel, r.in_acc_mean_rel, static_cast<long long>(r.flips),
                static_cast<long long>(r.exact));
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc == 10 && std::string(argv[1]) == "--ops") {
    try {
      return run_ops(argv);
    } catch (const std::exception& e) {
      std::cerr << "twin_compare: error: " << e.what() << "\n";
      return 1;
    }
  }
  if (argc != 5) {
    std::cerr << "usage: twin_compare DTYPE OP VALUE.f32 REFERENCE.f32\n";
    return 2;
  }
  try {
    const ampscope::DType dtype = ampscope::parse_dtype(argv[1]);
    const ampscope::Tensor y = tensor_of(read_floats(argv[3])).to(dtype);
    const ampscope::Tensor r = tensor_of(read_floats(argv[4]));
    const ampscope::probe::ErrorStats s = ampscope::probe::compare(y, r, dtype, argv[2]);
    std::printf("{\"counted\": %lld, \"max_rel\": %.17g, \"mean_rel\": %.17g, \"max_ulp\": %.17g, \"flips\": %lld, "
                "\"bits\": %.17g, \"exact\": %lld, \"error_bins\": [",
                static_cast<long long>(s.counted), s.max_rel, s.mean_rel, s.max_ulp, static_cast<long long>(s.flips),
                s.bits, static_cast<long long>(s.exact));
    for (std::size_t k = 0; k < s.error_bins.size(); ++k) {
      std::printf("%s%lld", k ? ", " : "", static_cast<long long>(s.error_bins[k]));
    }
    std::printf("]}\n");
  } catch (const std::exception& e) {
    std::cerr << "twin_compare: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
