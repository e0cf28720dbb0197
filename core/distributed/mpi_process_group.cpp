// The MPI process group (Open MPI from Debian: libopenmpi-dev). The only file of ampscope that includes
// mpi.h. CPU tensors travel as bytes; the reductions are computed here, not by MPI's built-in operations,
// so that every dtype (f16 and bf16 have no MPI type) gets the same documented order and rounding: each
// rank receives every rank's copy of its share of the tensor (MPI_Alltoall), folds them in rank order,
// and the folded shares are gathered back to every rank (MPI_Allgatherv). That is the same traffic as a
// ring all-reduce (2 (N - 1) / N of the tensor per rank) and gives every rank the same bits.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/distributed/mpi_process_group.h"

namespace ampscope::detail {

namespace {

std::atomic<bool> g_group_alive{false};

// MPI's own text for an error code.
std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<std::size_t>(length));
}

// ---- the reductions: one step of the left fold, acc = acc op x, in the dtype's rounding ----

template <class T>
T add(T a, T b) {
  if constexpr (std::is_same_v<T, std::int64_t>) {
    // Two's complement wrap-around, without signed overflow.
    return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
  } else if constexpr (std::is_same_v<T, f16> || std::is_same_v<T, bf16>) {
    // The float sum of two f16 (bf16) values rounded once more to f16 (bf16) is the exactly rounded sum:
    // float has 24 significand bits, at least 2p + 2 for p = 11 (8), so the first rounding never changes
    // the second (Figueroa, "When is double rounding innocuous?", 1995).
    return T(static_cast<float>(a) + static_cast<float>(b));
  } else {
    return a + b;
  }
}

template <class T>
bool is_nan(T v) {
  if constexpr (std::is_same_v<T, std::int64_t>) {
    return false;
  } else if constexpr (std::is_same_v<T, f16> || std::is_same_v<T, bf16>) {
    return std::isnan(static_cast<float>(v));
  } else {
    return std::isnan(v);
  }
}

template <class T>
T maximum(T acc, T x) {
  if (is_nan(acc)) return acc;  // the lowest rank's NaN
  if (is_nan(x)) return x;
  // Ties keep the lower rank's value. f16 and bf16 compare through float (exact); the others natively.
  if constexpr (std::is_same_v<T, f16> || std::is_same_v<T, bf16>) {
    return static_cast<float>(x) > static_cast<float>(acc) ? x : acc;
  } else {
    return x > acc ? x : acc;
  }
}

// out[i] = fold over p = 0 .. parts-1 of part p's element i; part p is at parts_data + p * n elements.
void fold_parts(ReduceOp op, DType dtype, const std::byte* parts_data, int parts, std::int64_t n, void* out) {
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_same_v<T, bool>) {
      throw DTypeError("fold_parts: bool is not reduced");  // refused by ProcessGroup before
    } else {
      const T* src = reinterpret_cast<const T*>(parts_data);
      T* dst = static_cast<T*>(out);
      for (std::int64_t i = 0; i < n; ++i) {
        T acc = src[i];
        for (int p = 1; p < parts; ++p) {
          const T x = src[static_cast<std::int64_t>(p) * n + i];
          acc = op == ReduceOp::sum ? add(acc, x) : maximum(acc, x);
        }
        dst[i] = acc;
      }
    }
  });
}

class MpiProcessGroup final : public ProcessGroup {
 public:
  explicit MpiProcessGroup(const ProcessGroupOptions& options) : options_(options), owner_(std::this_thread::get_id()) {
    if (options.mpi_segment_bytes == 0) {
      throw Error("make_process_group: mpi_segment_bytes is 0; it must be at least one element's size");
    }
    if (!(options.shutdown_timeout_s >= 0)) {
      throw Error(fmt::format("make_process_group: shutdown_timeout_s is {}; it must be 0 or more seconds",
                              options.shutdown_timeout_s));
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) {
      throw Error("make_process_group: MPI was already finalized in this process (a process group that started it "
                  "was destroyed), and MPI cannot start twice\nhint: create one process group for the whole run");
    }
    if (g_group_alive.exchange(true)) {
      throw Error("make_process_group: this process already has an MPI process group\nhint: create one process "
                  "group for the whole run and pass it where it is needed");
    }
    try {
      int initialized = 0;
      MPI_Initialized(&initialized);
      if (!initialized) {
        int provided = 0;
        // FUNNELED: the group is used from the thread that made it (checked); other threads (the CPU
        // backend's pool, the trace writer) never call MPI.
        check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "make_process_group",
              "MPI_Init_thread");
        initialized_here_ = true;
      }
      check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "make_process_group", "MPI_Comm_dup");
      // Errors come back as codes, which become exceptions naming the op (MPI's default aborts the job).
      check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "make_process_group", "MPI_Comm_set_errhandler");
      // The shutdown handshake has a communicator of its own, so it can never be matched with a collective
      // another rank is still waiting in.
      check(MPI_Comm_dup(MPI_COMM_WORLD, &shutdown_comm_), "make_process_group", "MPI_Comm_dup");
      check(MPI_Comm_rank(comm_, &rank_), "make_process_group", "MPI_Comm_rank");
      check(MPI_Comm_size(comm_, &size_), "make_process_group", "MPI_Comm_size");
    } catch (...) {
      g_group_alive = false;
      throw;
    }
  }

  ~MpiProcessGroup() override {
    // Every rank must reach this point before any calls MPI_Finalize, which waits for all of them: a
    // rank that got here early (an exception caught in main, a return) while another still waits in a
    // collective for it would otherwise leave both waiting forever. So wait, bounded, and abort the job
    // when the others do not come.
    MPI_Request request = MPI_REQUEST_NULL;
    if (MPI_Ibarrier(shutdown_comm_, &request) == MPI_SUCCESS) {
      const auto deadline = std::chrono::steady_clock::now() +
                            std::chrono::duration<double>(options_.shutdown_timeout_s);
      int done = 0;
      while (MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) {
        if (std::chrono::steady_clock::now() > deadline) {
          std::fprintf(stderr,
                       "ampscope: rank %d of %d is leaving, but the other ranks did not reach the end of the run "
                       "within %g s (they may be waiting for this rank in a collective): aborting the MPI job\n",
                       rank_, size_, options_.shutdown_timeout_s);
          std::fflush(stderr);
          MPI_Abort(MPI_COMM_WORLD, 1);
          std::_Exit(1);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    MPI_Comm_free(&shutdown_comm_);
    MPI_Comm_free(&comm_);
    if (initialized_here_) MPI_Finalize();
    g_group_alive = false;
  }

  std::string_view name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void barrier() override {
    check_thread("barrier");
    check(MPI_Barrier(comm_), "barrier", "MPI_Barrier");
  }

  std::vector<std::string> all_gather_bytes(std::string_view bytes) override {
    check_thread("all_gather_bytes");
    const std::string what = fmt::format("all_gather_bytes of {} bytes", bytes.size());
    const auto mine = static_cast<std::int64_t>(bytes.size());
    std::vector<std::int64_t> lengths(static_cast<std::size_t>(size_));
    check(MPI_Allgather(&mine, 1, MPI_INT64_T, lengths.data(), 1, MPI_INT64_T, comm_), what, "MPI_Allgather");
    std::int64_t total = 0;
    for (std::int64_t n : lengths) total += n;
    if (total > INT_MAX) {  // every rank sees the same lengths, so every rank throws
      throw Error(fmt::format("{} ({}): the ranks' bytes add up to {} bytes, more than the 2 GiB one call takes",
                              what, describe(), total));
    }
    std::vector<int> counts(lengths.begin(), lengths.end()), displs(counts.size());
    for (std::size_t i = 1; i < counts.size(); ++i) displs[i] = displs[i - 1] + counts[i - 1];
    std::string all(static_cast<std::size_t>(total), '\0');
    check(MPI_Allgatherv(bytes.data(), static_cast<int>(mine), MPI_BYTE, all.data(), counts.data(), displs.data(),
                         MPI_BYTE, comm_),
          what, "MPI_Allgatherv");
    std::vector<std::string> result;
    for (std::size_t i = 0; i < counts.size(); ++i) result.push_back(all.substr(displs[i], counts[i]));
    return result;
  }

  std::string broadcast_bytes(std::string_view bytes, int root) override {
    check_thread("broadcast_bytes");
    const std::string what = fmt::format("broadcast_bytes from rank {}", root);
    if (root < 0 || root >= size_) {
      throw IndexError(fmt::format("{} ({}): root {} is not a rank of this group (0 to {})", what, describe(), root,
                                   size_ - 1));
    }
    std::int64_t length = rank_ == root ? static_cast<std::int64_t>(bytes.size()) : 0;
    check(MPI_Bcast(&length, 1, MPI_INT64_T, root, comm_), what, "MPI_Bcast");
    if (length > INT_MAX) {
      throw Error(fmt::format("{} ({}): {} bytes, more than the 2 GiB one call takes", what, describe(), length));
    }
    std::string result = rank_ == root ? std::string(bytes) : std::string(static_cast<std::size_t>(length), '\0');
    check(MPI_Bcast(result.data(), static_cast<int>(length), MPI_BYTE, root, comm_), what, "MPI_Bcast");
    return result;
  }

  [[noreturn]] void abort(int exit_code) noexcept override {
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; this is for the compiler
  }

 protected:
  void cpu_all_reduce(const CommBuffer& buffer, ReduceOp op, const std::string& what) override {
    check_thread("all_reduce");
    const std::size_t esize = dtype_size(buffer.dtype);
    auto* base = static_cast<std::byte*>(buffer.data);
    const std::int64_t segment = segment_elements(esize);
    std::vector<std::byte> received;
    std::vector<int> counts(size_), displs(size_), recv_counts(size_), recv_displs(size_);
    for (std::int64_t start = 0; start < buffer.numel; start += segment) {
      const std::int64_t len = std::min(segment, buffer.numel - start);
      // Rank j owns share j of this segment: len / N elements, one more for the first len % N ranks.
      for (int j = 0; j < size_; ++j) {
        const std::int64_t share = len / size_ + (j < len % size_ ? 1 : 0);
        counts[j] = static_cast<int>(share * static_cast<std::int64_t>(esize));
        displs[j] = j == 0 ? 0 : displs[j - 1] + counts[j - 1];
      }
      const int mine = counts[rank_];
      for (int i = 0; i < size_; ++i) {
        recv_counts[i] = mine;
        recv_displs[i] = i * mine;
      }
      received.resize(static_cast<std::size_t>(mine) * size_);
      std::byte* segment_data = base + start * static_cast<std::int64_t>(esize);
      check(MPI_Alltoallv(segment_data, counts.data(), displs.data(), MPI_BYTE, received.data(), recv_counts.data(),
                          recv_displs.data(), MPI_BYTE, comm_),
            what, "MPI_Alltoallv");
      fold_parts(op, buffer.dtype, received.data(), size_, mine / static_cast<std::int64_t>(esize),
                 segment_data + displs[rank_]);
      check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, segment_data, counts.data(), displs.data(), MPI_BYTE,
                           comm_),
            what, "MPI_Allgatherv");
    }
  }

  void cpu_broadcast(const CommBuffer& buffer, int root, const std::string& what) override {
    check_thread("broadcast");
    const std::size_t esize = dtype_size(buffer.dtype);
    auto* base = static_cast<std::byte*>(buffer.data);
    const std::int64_t segment = segment_elements(esize);
    for (std::int64_t start = 0; start < buffer.numel; start += segment) {
      const std::int64_t len = std::min(segment, buffer.numel - start);
      check(MPI_Bcast(base + start * static_cast<std::int64_t>(esize), static_cast<int>(len * esize), MPI_BYTE, root,
                      comm_),
            what, "MPI_Bcast");
    }
  }

  void cpu_all_gather(const CommBuffer& input, const CommBuffer& output, const std::string& what) override {
    check_thread("all_gather");
    const auto esize = static_cast<std::int64_t>(dtype_size(input.dtype));
    const auto* in = static_cast<const std::byte*>(input.data);
    auto* out = static_cast<std::byte*>(output.data);
    const std::int64_t n = input.numel;
    // Pieces of at most one segment in all (the gathered piece of every rank), through a buffer: the
    // output's parts are n elements apart, which MPI_Allgather cannot write directly piece by piece.
    const std::int64_t segment = std::max<std::int64_t>(1, segment_elements(esize) / size_);
    std::vector<std::byte> gathered;
    for (std::int64_t start = 0; start < n; start += segment) {
      const std::int64_t len = std::min(segment, n - start);
      const std::int64_t bytes = len * esize;
      gathered.resize(static_cast<std::size_t>(bytes * size_));
      check(MPI_Allgather(in + start * esize, static_cast<int>(bytes), MPI_BYTE, gathered.data(),
                          static_cast<int>(bytes), MPI_BYTE, comm_),
            what, "MPI_Allgather");
      for (int p = 0; p < size_; ++p) {
        std::memcpy(out + (p * n + start) * esize, gathered.data() + p * bytes, static_cast<std::size_t>(bytes));
      }
    }
  }

  void cpu_reduce_scatter(const CommBuffer& input, const CommBuffer& output, ReduceOp op,
                          const std::string& what) override {
    check_thread("reduce_scatter");
    const auto esize = static_cast<std::int64_t>(dtype_size(input.dtype));
    const auto* in = static_cast<const std::byte*>(input.data);
    auto* out = static_cast<std::byte*>(output.data);
    const std::int64_t m = output.numel;
    const std::int64_t segment = std::max<std::int64_t>(1, segment_elements(esize) / size_);
    std::vector<std::byte> outgoing, received;
    for (std::int64_t start = 0; start < m; start += segment) {
      const std::int64_t len = std::min(segment, m - start);
      const std::int64_t bytes = len * esize;
      // Part j of the input goes to rank j. Packed first: with the output being this rank's own part of
      // the input (in place), the output's piece is written only after the piece was sent.
      outgoing.resize(static_cast<std::size_t>(bytes * size_));
      received.resize(outgoing.size());
      for (int j = 0; j < size_; ++j) {
        std::memcpy(outgoing.data() + j * bytes, in + (j * m + start) * esize, static_cast<std::size_t>(bytes));
      }
      check(MPI_Alltoall(outgoing.data(), static_cast<int>(bytes), MPI_BYTE, received.data(), static_cast<int>(bytes),
                         MPI_BYTE, comm_),
            what, "MPI_Alltoall");
      fold_parts(op, input.dtype, received.data(), size_, len, out + start * esize);
    }
  }

 private:
  // Elements per segment: the option's bytes, at least one element per rank, and MPI's int byte counts.
  std::int64_t segment_elements(std::size_t esize) const {
    const std::size_t bytes = std::min<std::size_t>(options_.mpi_segment_bytes, INT_MAX / 2);
    return std::max<std::int64_t>(static_cast<std::int64_t>(bytes / esize), size_);
  }

  void check_thread(const char* op) const {
    if (std::this_thread::get_id() != owner_) {
      throw Error(fmt::format("{} ({}): called from a thread other than the one that created the MPI process "
                              "group (MPI was initialised with MPI_THREAD_FUNNELED)\nhint: make every collective "
                              "call from the thread that called make_process_group",
                              op, describe()));
    }
  }

  void check(int code, const std::string& what, const char* call) const {
    if (code == MPI_SUCCESS) return;
    const std::string who = comm_ == MPI_COMM_NULL ? std::string("mpi") : describe();
    throw DeviceRuntimeError(fmt::format("{} ({}): {} failed: {}\nhint: another rank may have left the run, or the "
                                         "ranks' calls differ (each rank must make the same collectives in the "
                                         "same order, with the same dtype and number of elements)",
                                         what, who, call, mpi_error_text(code)));
  }

  ProcessGroupOptions options_;
  std::thread::id owner_;
  bool initialized_here_ = false;
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm shutdown_comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_mpi_process_group(const ProcessGroupOptions& options) {
  return std::make_unique<MpiProcessGroup>(options);
}

}  // namespace ampscope::detail
