// twin_compare: probe::compare() (probes/twin.h) on two arrays from files, printed as JSON, so that
// tests/record/twin_test.py can check that the PyTorch recorder's twin (python/ampscope/torch/_twin.py)
// computes the same error measures as the runtime's twin on the same values.
// Usage: twin_compare DTYPE OP VALUE.f32 REFERENCE.f32: each file holds float32 values (native byte order);
// the value is converted to DTYPE (f16, bf16, f32; the test writes values DTYPE holds exactly).
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
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
}  // namespace

int main(int argc, char** argv) {
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
