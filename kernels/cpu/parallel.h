// kernels/cpu/parallel.h: split a range over the CPU's cores (OpenMP), for element-wise work that is
// large enough to pay for the threads.
//
//   parallel_for(n, kElementwiseGrain, [&](std::int64_t begin, std::int64_t end) { ... });
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace ampscope::cpu {

// Below this many elements one thread does the work: a fork/join costs a few microseconds, about as
// long as one core needs for 32k simple element operations.
inline constexpr std::int64_t kElementwiseGrain = 32768;

// Calls fn(begin, end) on disjoint chunks covering [0, n). fn must not throw.
template <class Fn>
void parallel_for(std::int64_t n, std::int64_t grain, const Fn& fn) {
  if (n <= 0) return;
#if defined(_OPENMP)
  const std::int64_t max_chunks = (n + grain - 1) / std::max<std::int64_t>(grain, 1);
  const int threads = static_cast<int>(std::min<std::int64_t>(omp_get_max_threads(), max_chunks));
  if (threads > 1 && !omp_in_parallel()) {
#pragma omp parallel num_threads(threads)
    {
      const std::int64_t t = omp_get_thread_num();
      const std::int64_t nt = omp_get_num_threads();
      const std::int64_t begin = n * t / nt;
      const std::int64_t end = n * (t + 1) / nt;
      if (begin < end) fn(begin, end);
    }
    return;
  }
#endif
  fn(0, n);
}

}  // namespace ampscope::cpu
