// core/distributed/process_group.h: the processes of a data-parallel run and the collectives between them, on
// Tensors. The foundation of `ampscope train --ddp` (core/distributed/data_parallel.h, docs/distributed.md).
//
// make_process_group() gives the MPI group when the process was started by mpirun (Open MPI, or a PMI
// launcher such as Slurm's) and a single-process group otherwise, so the same program runs with and
// without a launcher. CPU tensors travel over MPI; CUDA tensors over NCCL once the group is connected to
// the device (connect). A group of size 1 needs neither.
//
//   auto group = make_process_group();               // "mpi" under mpirun -np N, else "single"
//   Tensor g = param.grad();                         // contiguous, the same shape on every rank
//   group->all_reduce(g);                            // in place: the sum over ranks, in rank order
//   g.copy_(div(g, group->size()));                  // averaged, as DDP does
//   auto hashes = group->all_gather_bytes(config_hash);  // one string per rank, in rank order
//
// Semantics every implementation keeps (checked before anything is sent, on the calling rank, so a wrong
// call throws there instead of corrupting another rank's data):
//  - Tensors are contiguous (an offset into a larger storage is fine, strides are not), of dtype f32,
//    f64, f16, bf16 or i64 (bool is refused), on the CPU or on a CUDA device this group is connected to
//    (a group of size 1 also takes unconnected CUDA tensors: its collectives are copies). The calls work on
//    the data only: no autograd node is recorded and no probe sees them.
//  - Every rank makes the same calls in the same order, with the same dtype and numel (not checked
//    across ranks: that would cost a round trip per call). A mismatch is undefined: the MPI group
//    then fails with MPI's error or waits until the job is aborted.
//  - Sum and max on the CPU (single and MPI groups) are a left fold over ranks in rank order,
//    ((x_0 + x_1) + x_2) + ..., each step rounded to the tensor's dtype: f16 and bf16 add in float and
//    round once to nearest even, which equals the exactly rounded f16/bf16 sum (float's 24 bits are at
//    least 2p + 2 for p = 11 and 8, so the double rounding is harmless); i64 wraps around (two's
//    complement). Max is NaN if any element is NaN (the lowest rank's NaN), otherwise the largest, with
//    ties (+0 and -0) keeping the lower rank's value. Every rank gets the same bits. (PyTorch's gloo and
//    NCCL also sum f16 in f16 with one rounding per addition, in an order set by their algorithm.)
//  - On CUDA tensors (NCCL) sum is NCCL's, in the order of NCCL's algorithm: with two ranks this is the
//    same bits as the CPU's (IEEE addition commutes); with more, it may differ in the last place. Max of
//    floating tensors is the CPU's rule bit for bit (NaN kept): NCCL's own max drops a NaN, so the ranks'
//    tensors are gathered and folded in rank order on the GPU (kernels/rank_fold.h). NCCL calls are queued on the CUDA backend's stream and return before they complete; later
//    ops on the tensor see the result.
//  - Errors name the op, the group ("mpi, rank 1 of 2"), the tensor's shape, dtype and device, and
//    what to do. A failure inside MPI or NCCL throws DeviceRuntimeError with the library's own text.
//
// Leaving a run: a rank that dies (a signal, std::_Exit) makes mpirun end the whole job at once (Open
// MPI's runtime sees a process leave without MPI_Finalize). A rank that only throws should let the
// error reach main and call group->abort(1) there; a rank whose MPI group is destroyed while the
// others are still communicating (they would wait forever in MPI_Finalize) aborts the job after the
// group's shutdown timeout (ProcessGroupOptions).
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/distributed/communicator.h"
#include "core/device.h"
#include "core/tensor.h"

namespace ampscope {

class ProcessGroup {
 public:
  virtual ~ProcessGroup();
  ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  virtual std::string_view name() const = 0;  // "single", "mpi"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "mpi, rank 1 of 2": how errors name the group and this process.
  std::string describe() const;

  // ---- collectives on tensors (semantics above) ----
  // In place: every rank's tensor ends holding the reduction over all ranks.
  void all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum);
  // In place: every rank's tensor ends holding root's.
  void broadcast(const Tensor& tensor, int root);
  // output is [size() * n0, n1, ...] (concatenated along dim 0) or [size(), n0, n1, ...] (stacked) for an
  // input of shape [n0, n1, ...], same dtype and device; rank r's input lands in output's r-th part.
  void all_gather(const Tensor& output, const Tensor& input);
  // The reverse: input is [size() * n0, ...] or [size(), n0, ...] for an output [n0, ...]; rank r's
  // output is the reduction over ranks of every rank's r-th part.
  void reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::sum);

  // ---- host-side collectives ----
  virtual void barrier() = 0;
  // Every rank's bytes, in rank order (configuration hashes, names). Lengths may differ between ranks.
  virtual std::vector<std::string> all_gather_bytes(std::string_view bytes) = 0;
  // root's bytes on every rank (the argument is ignored on the other ranks).
  virtual std::string broadcast_bytes(std::string_view bytes, int root) = 0;

  // ---- devices ----
  // Sets up the collectives of CUDA tensors on `device` (NCCL; its id made on rank 0 and broadcast over
  // this group). Collective: every rank calls it, each with its own GPU. Connecting the CPU does nothing
  // (CPU tensors always go through the group itself). Throws on every rank when one rank cannot go on: on
  // that rank its own error (DeviceError without the device, UnsupportedError when the build has no NCCL),
  // on the others a DeviceError naming that rank and quoting its error.
  void connect(Device device);
  bool connected(Device device) const;

  // Ends every process of the group with `exit_code` (MPI_Abort for MPI; this process only for a single
  // group). For main, after an error, so the other ranks do not wait for this one. Never returns.
  [[noreturn]] virtual void abort(int exit_code) noexcept = 0;

 protected:
  // CPU collectives on checked, contiguous buffers (numel > 0 is not guaranteed: an empty tensor calls
  // too, so that every rank makes the same calls). `what` is the error context ("all_reduce of [3] f32").
  virtual void cpu_all_reduce(const CommBuffer& buffer, ReduceOp op, const std::string& what) = 0;
  virtual void cpu_broadcast(const CommBuffer& buffer, int root, const std::string& what) = 0;
  virtual void cpu_all_gather(const CommBuffer& input, const CommBuffer& output, const std::string& what) = 0;
  virtual void cpu_reduce_scatter(const CommBuffer& input, const CommBuffer& output, ReduceOp op,
                                  const std::string& what) = 0;

 private:
  Communicator* communicator_for(const char* op, const Tensor& tensor) const;
  void check_root(const char* op, const Tensor& tensor, int root) const;

  std::map<int, std::unique_ptr<Communicator>> cuda_;  // connected CUDA devices, by index
};

// One process: rank 0 of 1. Every collective leaves its tensor as it is (all_gather and reduce_scatter
// copy input to output); barrier returns at once; abort ends this process (std::_Exit).
class SingleProcessGroup final : public ProcessGroup {
 public:
  std::string_view name() const override { return "single"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void barrier() override {}
  std::vector<std::string> all_gather_bytes(std::string_view bytes) override { return {std::string(bytes)}; }
  std::string broadcast_bytes(std::string_view bytes, int root) override;
  [[noreturn]] void abort(int exit_code) noexcept override;

 protected:
  void cpu_all_reduce(const CommBuffer&, ReduceOp, const std::string&) override {}
  void cpu_broadcast(const CommBuffer&, int, const std::string&) override {}
  void cpu_all_gather(const CommBuffer& input, const CommBuffer& output, const std::string& what) override;
  void cpu_reduce_scatter(const CommBuffer& input, const CommBuffer& output, ReduceOp op,
                          const std::string& what) override;
};

struct ProcessGroupOptions {
  // How long a rank whose MPI group is destroyed waits for every other rank to reach the same point
  // before it aborts the job (MPI_Abort) instead of finalizing. Finalizing while another rank still waits
  // in a collective would hang both forever (Open MPI's MPI_Finalize waits for every process).
  double shutdown_timeout_s = 60;
  // The MPI group reduces, gathers and broadcasts a tensor in pieces of at most this many bytes, which
  // bounds its temporary memory (one piece) and keeps MPI's int counts small. Any size > 0 gives the same
  // bits; tests set it small to cross piece boundaries.
  std::size_t mpi_segment_bytes = std::size_t{8} << 20;
};

// Whether this build has the MPI process group (configured with AMPSCOPE_MPI=ON).
bool mpi_available();

// Whether this process was started by an MPI launcher: mpirun/mpiexec of Open MPI (OMPI_COMM_WORLD_SIZE),
// or a PMI/PMIx launcher (PMI_SIZE, PMIX_RANK), such as Slurm's srun or MPICH's mpiexec.
bool launched_by_mpi();

// The MPI group (MPI initialised here, once per process) when launched_by_mpi(), the single-process group
// otherwise. Throws Error when launched by mpirun with more than one process in a build without MPI.
std::unique_ptr<ProcessGroup> make_process_group(const ProcessGroupOptions& options = {});

}  // namespace ampscope
