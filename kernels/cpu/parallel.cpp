// The CPU backend's thread pool: workers that sleep between jobs, one job at a time.
#include "kernels/cpu/parallel.h"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ampscope::cpu {
namespace {

thread_local bool t_in_region = false;

int configured_threads() {
  for (const char* var : {"AMPSCOPE_NUM_THREADS", "OMP_NUM_THREADS"}) {
    if (const char* v = std::getenv(var)) {
      try {
        const int n = std::stoi(v);
        if (n >= 1) return n;
      } catch (const std::exception&) {
        // Not a number: fall through to the next source, as OpenMP ignores a malformed value.
      }
    }
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

class Pool {
 public:
  explicit Pool(int threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void run(int tasks, const std::function<void(int)>& task) {
    std::unique_lock<std::mutex> job_lock(job_mutex_);  // one job at a time (callers from several threads)
    {
      std::lock_guard<std::mutex> lock(mutex_);
      task_ = &task;
      tasks_ = tasks;
      next_.store(0);
      remaining_ = tasks;
      ++generation_;
    }
    wake_.notify_all();
    drain();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return remaining_ == 0; });
    task_ = nullptr;
  }

 private:
  // Takes tasks until none are left; the last one to finish wakes the caller.
  void drain() {
    t_in_region = true;
    int finished = 0;
    for (int t = next_.fetch_add(1); t < tasks_; t = next_.fetch_add(1)) {
      (*task_)(t);
      ++finished;
    }
    t_in_region = false;
    if (finished > 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      remaining_ -= finished;
      if (remaining_ == 0) done_.notify_all();
    }
  }

  void work() {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      drain();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex job_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* task_ = nullptr;
  int tasks_ = 0;
  std::atomic<int> next_{0};
  int remaining_ = 0;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
};

Pool& pool() {
  // Never destroyed: kernels may run from static destructors of other translation units.
  static Pool* p = new Pool(configured_threads());
  return *p;
}

}  // namespace

int num_threads() { return pool().size(); }

namespace detail {
void run_tasks(int tasks, const std::function<void(int)>& task) { pool().run(tasks, task); }
bool in_parallel_region() { return t_in_region; }
}  // namespace detail

}  // namespace ampscope::cpu
