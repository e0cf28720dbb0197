// The CPU backend's thread pool: workers that wait a few microseconds for the next job, then sleep; one job
// at a time.
//
// A job is published under the mutex with a new generation number. A worker that wakes takes a copy of
// the job and registers itself as active under the same lock, so it can only ever run tasks of the job
// it copied. The caller waits until every task is done and no worker is active before it returns, and
// before it publishes the next job, so a late worker can never claim indices of a newer job.
//
// Both waits (a worker's for a job, the caller's for the workers) first spin for up to kSpin on atomic copies of
// what they wait for, and then wait on the condition variable as before: the spin only saves the sleep and the
// wake-up (a futex call each side, and tens of microseconds before a woken thread runs) when the next job or the
// last task comes within that time, as it does between the many short jobs of a convolution's products. What
// decides is always the check under the mutex, so the spin changes when threads run, never what they run.
#include "kernels/parallel.h"

#include <immintrin.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ampscope::cpu {
namespace {

thread_local bool t_in_region = false;

// Marks the thread as inside a job for its lifetime, also when a task throws.
class RegionGuard {
 public:
  RegionGuard() { t_in_region = true; }
  ~RegionGuard() { t_in_region = false; }
};

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
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// How long a thread spins before it sleeps. OpenMP's workers spin much longer after each parallel region
// (libgomp's GOMP_SPINCOUNT), which on a shared two-core machine took most of a step's CPU from everything
// else; this bound costs at most one spin per job and thread.
constexpr std::chrono::microseconds kSpin{20};

// Spins until done() or kSpin has passed; returns done()'s last answer.
template <class Done>
bool spin_until(Done done) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (;;) {
    for (int i = 0; i < 16; ++i) {
      if (done()) return true;
      _mm_pause();
    }
    if (std::chrono::steady_clock::now() >= until) return done();
    // Another thread that is ready to run on this core (the trace writer's, the user's) goes first: a
    // spinning thread holds a core only when nothing else wants it.
    sched_yield();
  }
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
      stopping_.store(true, std::memory_order_release);
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs the job; rethrows the first exception a task threw, after every task has finished.
  void run(int tasks, const std::function<void(int)>& task) {
    std::lock_guard<std::mutex> one_job(job_mutex_);  // callers on several threads take turns
    Job job{&task, tasks};
    {
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, [this] { return active_ == 0; });  // late workers of the last job have left
      job_ = job;
      next_.store(0);
      remaining_ = tasks;
      error_ = nullptr;
      ++generation_;
      published_.store(generation_, std::memory_order_release);
    }
    wake_.notify_all();
    drain(job);
    // Every task is claimed now; a worker that claimed one stays active until it has counted it.
    spin_until([this] { return busy_.load(std::memory_order_acquire) == 0; });
    std::exception_ptr error;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, [this] { return remaining_ == 0 && active_ == 0; });
      error = error_;
      error_ = nullptr;
    }
    if (error) std::rethrow_exception(error);
  }

 private:
  struct Job {
    const std::function<void(int)>* task = nullptr;
    int tasks = 0;
  };

  // Takes tasks of `job` until none are left, then reports how many it finished.
  void drain(const Job& job) {
    int finished = 0;
    std::exception_ptr error;
    {
      RegionGuard region;
      for (int t = next_.fetch_add(1); t < job.tasks; t = next_.fetch_add(1)) {
        try {
          (*job.task)(t);
        } catch (...) {
          if (!error) error = std::current_exception();
        }
        ++finished;
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    remaining_ -= finished;
    if (error && !error_) error_ = error;
  }

  void work() {
    std::uint64_t seen = 0;
    for (;;) {
      spin_until([&] {
        return published_.load(std::memory_order_acquire) != seen || stopping_.load(std::memory_order_acquire);
      });
      Job job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
        ++active_;
        busy_.store(active_, std::memory_order_release);
      }
      drain(job);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --active_;
        busy_.store(active_, std::memory_order_release);
      }
      done_.notify_all();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex job_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  Job job_;
  std::atomic<int> next_{0};
  int remaining_ = 0;
  int active_ = 0;
  std::exception_ptr error_;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
  // Copies of generation_, active_ and stop_ for the spins, written under the mutex with them.
  std::atomic<std::uint64_t> published_{0};
  std::atomic<int> busy_{0};
  std::atomic<bool> stopping_{false};
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
