// kernels/parallel.h: split a range over the CPU's cores, for kernel work that is large enough to
// pay for the threads.
//
//   parallel_for(n, kElementwiseGrain, [&](std::int64_t begin, std::int64_t end) { ... });
//
// The pool's workers spin for at most 20 microseconds after a job, then sleep on a condition variable until
// the next; while they spin they let any other thread that is ready to run on their core go first
// (sched_yield), so the spin takes only a core nothing else wants (the trace writer's threads, issue 37). (OpenMP's workers spin much longer after each parallel region, libgomp's GOMP_SPINCOUNT; on a
// shared two-core machine that spinning took most of the CPU time of a training step away from everything
// else, including the other core's real work. Sleeping at once cost a wake-up, a futex call and tens of
// microseconds, at every one of the many short jobs of a step: the 2-thread CNN kept 1.82 cores busy where
// PyTorch kept 1.99.) The number of threads is AMPSCOPE_NUM_THREADS, else OMP_NUM_THREADS, else the number
// of cores.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>

namespace ampscope::cpu {

// Below this many elements one thread does the work: waking a worker and joining it costs a few
// microseconds, about as long as one core needs for 32k simple element operations.
inline constexpr std::int64_t kElementwiseGrain = 32768;

int num_threads();  // the pool's size, the calling thread included

namespace detail {
// Runs task(0) ... task(tasks - 1) on the pool, the caller taking part; returns when all are done.
void run_tasks(int tasks, const std::function<void(int)>& task);
bool in_parallel_region();
}  // namespace detail

// Calls fn(begin, end) on disjoint chunks covering [0, n), each at least `grain` long where possible.
// An exception from fn is rethrown to the caller once every chunk has finished. Nested calls (from
// inside a chunk) run on the calling thread.
template <class Fn>
void parallel_for(std::int64_t n, std::int64_t grain, const Fn& fn) {
  if (n <= 0) return;
  const std::int64_t max_chunks = (n + std::max<std::int64_t>(grain, 1) - 1) / std::max<std::int64_t>(grain, 1);
  const int chunks = static_cast<int>(std::min<std::int64_t>(num_threads(), max_chunks));
  if (chunks <= 1 || detail::in_parallel_region()) {
    fn(0, n);
    return;
  }
  detail::run_tasks(chunks, [&](int t) {
    const std::int64_t begin = n * t / chunks, end = n * (t + 1) / chunks;
    if (begin < end) fn(begin, end);
  });
}

}  // namespace ampscope::cpu
