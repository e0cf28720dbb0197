// The CPU backend's thread pool: every index exactly once, exceptions reach the caller, nesting runs inline.
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/parallel.h"

namespace ampscope::cpu {
namespace {

TEST(parallel_test, covers_every_index_exactly_once_over_many_jobs) {
  // Many small jobs back to back: a worker that woke late for one job must never run a task of the next.
  std::vector<std::atomic<int>> hits(997);
  for (int job = 0; job < 2000; ++job) {
    parallel_for(static_cast<std::int64_t>(hits.size()), 1, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1);
    });
  }
  for (std::size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i].load(), 2000) << "index " << i;
}

TEST(parallel_test, an_exception_in_a_chunk_reaches_the_caller_and_the_pool_keeps_working) {
  if (num_threads() < 2) GTEST_SKIP() << "one thread: chunks run inline";
  EXPECT_THROW(parallel_for(1000, 1, [](std::int64_t b, std::int64_t) {
                 if (b == 0) throw std::runtime_error("chunk failed");
               }),
               std::runtime_error);
  EXPECT_FALSE(detail::in_parallel_region());
  std::atomic<std::int64_t> total{0};
  parallel_for(1000, 1, [&](std::int64_t b, std::int64_t e) { total += e - b; });
  EXPECT_EQ(total.load(), 1000);
}

TEST(parallel_test, the_caller_waits_for_tasks_that_outlast_the_spin_and_workers_wake_after_sleeping) {
  // Tasks of 300 us, far longer than the 20 us the threads spin: the caller must sleep and be woken for the
  // worker's last task, and a job published after a 2 ms gap must reach workers that went to sleep.
  if (num_threads() < 2) GTEST_SKIP() << "one thread: chunks run inline";
  std::atomic<int> other_threads{0};  // over all jobs: a loaded machine may leave one job to the caller alone
  for (int job = 0; job < 20; ++job) {
    std::vector<int> done(8, 0);  // plain ints: the caller reads them only after parallel_for returned
    const auto caller = std::this_thread::get_id();
    parallel_for(8, 1, [&](std::int64_t b, std::int64_t e) {
      if (std::this_thread::get_id() != caller) other_threads.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(300));
      for (std::int64_t i = b; i < e; ++i) done[static_cast<std::size_t>(i)] = 1;
    });
    for (std::size_t i = 0; i < done.size(); ++i) ASSERT_EQ(done[i], 1) << "job " << job << ", index " << i;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_GT(other_threads.load(), 0) << "no worker took a task in 20 jobs";
}

TEST(parallel_test, nested_calls_run_on_the_calling_thread) {
  std::atomic<int> inner_chunks{0};
  parallel_for(4, 1, [&](std::int64_t, std::int64_t) {
    parallel_for(100, 1, [&](std::int64_t b, std::int64_t e) {
      EXPECT_EQ(b, 0);
      EXPECT_EQ(e, 100);
      ++inner_chunks;
    });
  });
  EXPECT_GE(inner_chunks.load(), 1);
}

}  // namespace
}  // namespace ampscope::cpu
