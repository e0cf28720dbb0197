// core/distributed/communicator.h: the raw collectives a device's communication library offers (NCCL for CUDA
// memory), on contiguous buffers in that device's memory. It sits in core's lowest layer so a backend in
// kernels/ can implement it without seeing Tensor; users call the Tensor-level ProcessGroup instead
// (core/distributed/process_group.h), which checks shapes, dtypes and devices and then calls one of these.
//
//   std::string id = backend_for(Device::cuda(0)).new_communicator_id();      // on rank 0, then broadcast
//   auto comm = backend_for(Device::cuda(0)).create_communicator(id, rank, size);
//   comm->all_reduce({ptr, n, DType::f32}, ReduceOp::sum);                    // queued on the backend's stream
#pragma once

#include <cstdint>
#include <string_view>

#include "core/dtype.h"

namespace ampscope {

// What a reduction computes. The exact order and rounding of each implementation are documented with
// ProcessGroup (core/distributed/process_group.h) and in docs/distributed.md.
enum class ReduceOp : std::uint8_t { sum, max };

constexpr std::string_view reduce_op_name(ReduceOp op) { return op == ReduceOp::sum ? "sum" : "max"; }

// numel elements of `dtype`, contiguous, starting at `data` (a pointer into the communicator's device memory).
struct CommBuffer {
  void* data = nullptr;
  std::int64_t numel = 0;
  DType dtype = DType::f32;
};

// One communicator: `size` processes, this one being `rank`, all with buffers on the same kind of device.
// Every call is collective: every rank makes the same calls in the same order with the same numel and
// dtype. Calls may be asynchronous with respect to the host (CUDA: queued on the backend's stream, so
// later work on that stream sees the result); a failure throws DeviceRuntimeError with the library's text.
class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual std::string_view name() const = 0;  // "nccl"
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: every rank's buffer ends holding the reduction of all ranks' buffers.
  virtual void all_reduce(const CommBuffer& buffer, ReduceOp op) = 0;
  // In place: every rank's buffer ends holding root's.
  virtual void broadcast(const CommBuffer& buffer, int root) = 0;
  // output.numel == size() * input.numel; rank r's input lands at output elements [r n, (r + 1) n).
  virtual void all_gather(const CommBuffer& input, const CommBuffer& output) = 0;
  // input.numel == size() * output.numel; rank r's output is the reduction of every rank's chunk r.
  virtual void reduce_scatter(const CommBuffer& input, const CommBuffer& output, ReduceOp op) = 0;
  // Waits on the host until the collectives queued so far have completed.
  virtual void synchronize() = 0;
};

}  // namespace ampscope
