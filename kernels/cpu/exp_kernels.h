// exp over contiguous float arrays with the bits of the C library's expf (the CPU backend's softmax and
// log_softmax rows, issue 37). glibc's expf (2.28 and later: a 32-entry table of 2^(i/32) and a cubic in
// double, rounded once to float) is computed here sixteen elements at a time with AVX-512; it is used only
// where it has been checked, at first use, to give std::exp's bits on this process's libm (its FMA build:
// the one glibc picks on a CPU with FMA and AVX2), else every element goes to std::exp as before. Either way
// out[i] is std::exp(x[i]) bit for bit (tests/kernels/exp_f32_test.cpp; docs/numerics.md).
#pragma once

#include <cstdint>

namespace ampscope::cpu {

// out[i] = std::exp(x[i]) for i < n, bit for bit, on the widest path this CPU and libm allow. out may be x.
void exp_f32(const float* x, float* out, std::int64_t n);

// One path by name, for the tests and benchmarks.
enum class ExpPath { scalar, avx512 };
// Whether this CPU can run `path` (for avx512: AVX-512 F and FMA), whatever the check against libm says.
bool exp_path_available(ExpPath path);
// Whether `path` gave std::exp's bits on every value of the first-use check (exp_f32 takes it only then).
bool exp_path_matches_libm(ExpPath path);
// The loop on `path`; the caller checks exp_path_available first.
void exp_f32_on(ExpPath path, const float* x, float* out, std::int64_t n);

}  // namespace ampscope::cpu
