// The NCCL communicator (kernels/cuda/nccl_communicator.h). One ncclComm_t per process and device, every
// call checked once; a failure carries the call, NCCL's error name and its last error text.
#include "kernels/cuda/nccl_communicator.h"

#include <cstring>

#include <fmt/format.h>
#include <nccl.h>

#include "core/error.h"
#include "kernels/cuda/collective_launch.h"
#include "kernels/cuda/cuda_check.h"

namespace ampscope::cuda {

namespace {

void check_nccl(ncclResult_t result, std::string_view call, ncclComm_t comm = nullptr) {
  if (result == ncclSuccess) return;
  const char* last = comm != nullptr ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  throw DeviceRuntimeError(fmt::format("NCCL call {} failed: {}{}{}", call, ncclGetErrorString(result),
                                       last != nullptr && *last != '\0' ? ": " : "", last != nullptr ? last : ""));
}

#define AMPSCOPE_NCCL_CHECK(call, comm) check_nccl((call), #call, (comm))

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i64: return ncclInt64;
    case DType::boolean: break;
  }
  throw DTypeError(fmt::format("nccl: dtype {} has no NCCL type (f32, f64, f16, bf16, i64 have)", dtype_name(dtype)));
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : ncclMax; }

// NCCL's max is fmaxf's: a NaN on one rank is dropped. Floating max is gathered and folded instead.
bool folds_max(ReduceOp op, DType dtype) { return op == ReduceOp::max && dtype != DType::i64; }

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int device, cudaStream_t stream, const std::string& id, int rank, int size)
      : device_(device), stream_(stream), rank_(rank), size_(size) {
    if (id.size() != sizeof(ncclUniqueId)) {
      throw Error(fmt::format("nccl: a communicator id is {} bytes, but {} were given (rank {} of {})",
                              sizeof(ncclUniqueId), id.size(), rank, size));
    }
    ncclUniqueId unique{};
    std::memcpy(&unique, id.data(), sizeof unique);
    AMPSCOPE_CUDA_CHECK(cudaSetDevice(device_));
    AMPSCOPE_NCCL_CHECK(ncclCommInitRank(&comm_, size_, unique, rank_), nullptr);
  }
  ~NcclCommunicator() override {
    if (scratch_ != nullptr) {
      cudaSetDevice(device_);
      cudaStreamSynchronize(stream_);  // no throwing from a destructor: a failure here leaves only the block
      cudaFree(scratch_);
    }
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }

  std::string_view name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(const CommBuffer& buffer, ReduceOp op) override {
    select();
    if (folds_max(op, buffer.dtype)) {
      const std::int64_t n = buffer.numel;
      void* parts = scratch(static_cast<std::size_t>(n) * size_ * dtype_size(buffer.dtype));
      AMPSCOPE_NCCL_CHECK(ncclAllGather(buffer.data, parts, count(buffer), nccl_type(buffer.dtype), comm_, stream_),
                          comm_);
      AMPSCOPE_CUDA_CHECK(launch_rank_fold_max(buffer.dtype, parts, size_, n, 0, n, buffer.data, stream_));
      return;
    }
    AMPSCOPE_NCCL_CHECK(ncclAllReduce(buffer.data, buffer.data, count(buffer), nccl_type(buffer.dtype), nccl_op(op),
                                      comm_, stream_),
                        comm_);
  }
  void broadcast(const CommBuffer& buffer, int root) override {
    select();
    AMPSCOPE_NCCL_CHECK(
        ncclBroadcast(buffer.data, buffer.data, count(buffer), nccl_type(buffer.dtype), root, comm_, stream_), comm_);
  }
  void all_gather(const CommBuffer& input, const CommBuffer& output) override {
    select();
    AMPSCOPE_NCCL_CHECK(
        ncclAllGather(input.data, output.data, count(input), nccl_type(input.dtype), comm_, stream_), comm_);
  }
  void reduce_scatter(const CommBuffer& input, const CommBuffer& output, ReduceOp op) override {
    select();
    if (folds_max(op, input.dtype)) {
      // Every rank's whole input, then this rank's segment folded: output.numel elements at rank * numel.
      const std::int64_t whole = input.numel, m = output.numel;
      void* parts = scratch(static_cast<std::size_t>(whole) * size_ * dtype_size(input.dtype));
      AMPSCOPE_NCCL_CHECK(ncclAllGather(input.data, parts, count(input), nccl_type(input.dtype), comm_, stream_), comm_);
      AMPSCOPE_CUDA_CHECK(
          launch_rank_fold_max(input.dtype, parts, size_, whole, static_cast<std::int64_t>(rank_) * m, m, output.data, stream_));
      return;
    }
    AMPSCOPE_NCCL_CHECK(ncclReduceScatter(input.data, output.data, count(output), nccl_type(input.dtype), nccl_op(op),
                                          comm_, stream_),
                        comm_);
  }
  void synchronize() override {
    select();
    AMPSCOPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  void select() const { AMPSCOPE_CUDA_CHECK(cudaSetDevice(device_)); }
  static std::size_t count(const CommBuffer& buffer) { return static_cast<std::size_t>(buffer.numel); }
  // Device memory for a gathered max, kept between calls (the GradScaler's found_inf: one element a step)
  // and grown when a call needs more; the old block is freed once the stream has finished with it.
  void* scratch(std::size_t bytes) {
    if (bytes > scratch_bytes_) {
      if (scratch_ != nullptr) {
        AMPSCOPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
        AMPSCOPE_CUDA_CHECK(cudaFree(scratch_));
        scratch_ = nullptr;
        scratch_bytes_ = 0;
      }
      AMPSCOPE_CUDA_CHECK(cudaMalloc(&scratch_, bytes));
      scratch_bytes_ = bytes;
    }
    return scratch_;
  }

  int device_;
  cudaStream_t stream_;
  int rank_, size_;
  ncclComm_t comm_ = nullptr;
  void* scratch_ = nullptr;
  std::size_t scratch_bytes_ = 0;
};

}  // namespace

std::string nccl_unique_id() {
  ncclUniqueId id{};
  AMPSCOPE_NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
  return std::string(reinterpret_cast<const char*>(&id), sizeof id);
}

std::unique_ptr<Communicator> make_nccl_communicator(int device, cudaStream_t stream, const std::string& id, int rank,
                                                     int size) {
  return std::make_unique<NcclCommunicator>(device, stream, id, rank, size);
}

}  // namespace ampscope::cuda
