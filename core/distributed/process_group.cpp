// The Tensor-level process group: the checks every implementation shares, the routing of CUDA tensors to
// a connected device communicator, the single-process group and the factory. The MPI group is in
// mpi_process_group.cpp (built with AMPSCOPE_MPI only).
#include "core/distributed/process_group.h"

#include <cstdlib>
#include <cstring>
#include <exception>

#include <fmt/format.h>

#include "core/backend.h"
#include "core/error.h"
#include "core/distributed/mpi_process_group.h"

namespace ampscope {

namespace {

std::string tensor_desc(const Tensor& t) {
  return fmt::format("{} {} on {}", shape_str(t.shape()), dtype_name(t.dtype()), t.device().str());
}

CommBuffer buffer_of(const Tensor& t) { return {t.data(), t.numel(), t.dtype()}; }

// Byte ranges of two tensors' data overlap (both contiguous).
bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0 || a.device() != b.device()) return false;
  const auto* pa = static_cast<const std::byte*>(a.data());
  const auto* pb = static_cast<const std::byte*>(b.data());
  const std::size_t na = static_cast<std::size_t>(a.numel()) * dtype_size(a.dtype());
  const std::size_t nb = static_cast<std::size_t>(b.numel()) * dtype_size(b.dtype());
  return pa < pb + nb && pb < pa + na;
}

// The two shapes a gathered (or scattered) tensor may have for a part of shape `part`: concatenated along
// dim 0, or stacked along a new dim 0.
bool is_gathered_shape(const Shape& whole, const Shape& part, int size) {
  Shape stacked{size};
  stacked.insert(stacked.end(), part.begin(), part.end());
  if (whole == stacked) return true;
  if (part.empty()) return false;
  Shape concatenated = part;
  concatenated[0] *= size;
  return whole == concatenated;
}

std::string gathered_shapes(const Shape& part, int size) {
  Shape stacked{size};
  stacked.insert(stacked.end(), part.begin(), part.end());
  if (part.empty()) return shape_str(stacked);
  Shape concatenated = part;
  concatenated[0] *= size;
  return fmt::format("{} (concatenated) or {} (stacked)", shape_str(concatenated), shape_str(stacked));
}

}  // namespace

ProcessGroup::~ProcessGroup() = default;

std::string ProcessGroup::describe() const { return fmt::format("{}, rank {} of {}", name(), rank(), size()); }

namespace {

// role: "" for the one tensor of an in-place collective, "output " or "input ".
void check_tensor(const ProcessGroup& group, const char* op, const char* role, const Tensor& t) {
  if (!t.defined()) {
    throw Error(fmt::format("{} ({}): the {}tensor is undefined", op, group.describe(), role));
  }
  if (t.dtype() == DType::boolean) {
    throw DTypeError(fmt::format("{} ({}): the {}tensor {} is bool, which collectives do not take (f32, f64, f16, "
                                 "bf16, i64)\nhint: convert it first, t.to(DType::i64) or to a floating dtype",
                                 op, group.describe(), role, tensor_desc(t)));
  }
  if (!t.is_contiguous()) {
    throw ShapeError(fmt::format("{} ({}): the {}tensor {} is not contiguous (strides {}); collectives work on "
                                 "contiguous memory, as PyTorch's do\nhint: pass c = t.contiguous() and copy the "
                                 "result back with t.copy_(c)",
                                 op, group.describe(), role, tensor_desc(t), shape_str(t.strides())));
  }
}

void check_pair(const ProcessGroup& group, const char* op, const Tensor& output, const Tensor& input) {
  check_tensor(group, op, "output ", output);
  check_tensor(group, op, "input ", input);
  if (output.dtype() != input.dtype() || output.device() != input.device()) {
    throw DTypeError(fmt::format("{} ({}): the output {} and the input {} differ in dtype or device; both must be "
                                 "the same",
                                 op, group.describe(), tensor_desc(output), tensor_desc(input)));
  }
}

}  // namespace

Communicator* ProcessGroup::communicator_for(const char* op, const Tensor& tensor) const {
  const Device device = tensor.device();
  if (device.is_cpu()) return nullptr;
  if (auto it = cuda_.find(device.index); it != cuda_.end()) return it->second.get();
  if (size() == 1) return nullptr;  // one process: the collectives are copies, done with Tensor ops
  throw DeviceError(fmt::format("{} ({}): the tensor {} is on {}, which this process group is not connected "
                                "to\nhint: call group.connect(Device::parse(\"{}\")) on every rank first (NCCL), or "
                                "move the tensor to the CPU",
                                op, describe(), tensor_desc(tensor), device.str(), device.str()));
}

void ProcessGroup::check_root(const char* op, const Tensor& tensor, int root) const {
  if (root < 0 || root >= size()) {
    throw IndexError(fmt::format("{} ({}): root {} of the tensor {} is not a rank of this group (0 to {})", op,
                                 describe(), root, tensor_desc(tensor), size() - 1));
  }
}

void ProcessGroup::all_reduce(const Tensor& tensor, ReduceOp op) {
  check_tensor(*this, "all_reduce", "", tensor);
  const std::string what = fmt::format("all_reduce ({}) of {}", reduce_op_name(op), tensor_desc(tensor));
  if (Communicator* comm = communicator_for("all_reduce", tensor)) {
    comm->all_reduce(buffer_of(tensor), op);
  } else if (tensor.device().is_cpu()) {
    cpu_all_reduce(buffer_of(tensor), op, what);
  }  // else: an unconnected CUDA tensor in a group of one, already the result
}

void ProcessGroup::broadcast(const Tensor& tensor, int root) {
  check_tensor(*this, "broadcast", "", tensor);
  check_root("broadcast", tensor, root);
  const std::string what = fmt::format("broadcast from rank {} of {}", root, tensor_desc(tensor));
  if (Communicator* comm = communicator_for("broadcast", tensor)) {
    comm->broadcast(buffer_of(tensor), root);
  } else if (tensor.device().is_cpu()) {
    cpu_broadcast(buffer_of(tensor), root, what);
  }
}

void ProcessGroup::all_gather(const Tensor& output, const Tensor& input) {
  check_pair(*this, "all_gather", output, input);
  if (!is_gathered_shape(output.shape(), input.shape(), size())) {
    throw ShapeError(fmt::format("all_gather ({}): the output {} does not hold {} inputs of shape {}; it must be {}",
                                 describe(), tensor_desc(output), size(), shape_str(input.shape()),
                                 gathered_shapes(input.shape(), size())));
  }
  const auto esize = static_cast<std::int64_t>(dtype_size(input.dtype()));
  const bool in_place = static_cast<const std::byte*>(input.data()) ==
                        static_cast<const std::byte*>(output.data()) + rank() * input.numel() * esize;
  if (overlaps(output, input) && !in_place) {
    throw ShapeError(fmt::format("all_gather ({}): the input {} overlaps the output {} other than as rank {}'s part "
                                 "of it\nhint: use separate tensors, or gather in place with the input being the "
                                 "output's part {}",
                                 describe(), tensor_desc(input), tensor_desc(output), rank(), rank()));
  }
  const std::string what = fmt::format("all_gather of {} into {}", tensor_desc(input), tensor_desc(output));
  if (Communicator* comm = communicator_for("all_gather", input)) {
    comm->all_gather(buffer_of(input), buffer_of(output));
  } else if (input.device().is_cpu()) {
    cpu_all_gather(buffer_of(input), buffer_of(output), what);
  } else if (!in_place) {
    output.view({input.numel()}).copy_(input.view({input.numel()}));
  }
}

void ProcessGroup::reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) {
  check_pair(*this, "reduce_scatter", output, input);
  if (!is_gathered_shape(input.shape(), output.shape(), size())) {
    throw ShapeError(fmt::format("reduce_scatter ({}): the input {} is not {} parts of the output's shape {}; it must "
                                 "be {}",
                                 describe(), tensor_desc(input), size(), shape_str(output.shape()),
                                 gathered_shapes(output.shape(), size())));
  }
  const auto esize = static_cast<std::int64_t>(dtype_size(input.dtype()));
  const bool in_place = static_cast<const std::byte*>(output.data()) ==
                        static_cast<const std::byte*>(input.data()) + rank() * output.numel() * esize;
  if (overlaps(output, input) && !in_place) {
    throw ShapeError(fmt::format("reduce_scatter ({}): the output {} overlaps the input {} other than as rank {}'s "
                                 "part of it\nhint: use separate tensors, or reduce in place with the output being "
                                 "the input's part {}",
                                 describe(), tensor_desc(output), tensor_desc(input), rank(), rank()));
  }
  const std::string what = fmt::format("reduce_scatter ({}) of {} into {}", reduce_op_name(op), tensor_desc(input),
                                       tensor_desc(output));
  if (Communicator* comm = communicator_for("reduce_scatter", input)) {
    comm->reduce_scatter(buffer_of(input), buffer_of(output), op);
  } else if (input.device().is_cpu()) {
    cpu_reduce_scatter(buffer_of(input), buffer_of(output), op, what);
  } else if (!in_place) {
    output.view({output.numel()}).copy_(input.view({input.numel()}));
  }
}

void ProcessGroup::connect(Device device) {
  if (device.is_cpu() || connected(device)) return;
  // Rank 0 makes the id; everyone else gets it over this group (MPI), so NCCL needs no launcher of its own.
  // A rank without the device (or a build without NCCL) must not leave the others waiting for the id, so
  // every rank first tells every other whether it can go on, and all throw together when one cannot.
  Backend* backend = nullptr;
  std::string id;
  std::exception_ptr mine;
  std::string problem;
  try {
    backend = &backend_for(device);  // DeviceError when the device is not there
    if (rank() == 0) id = backend->new_communicator_id();  // UnsupportedError without NCCL
  } catch (const std::exception& e) {
    mine = std::current_exception();
    problem = e.what();
  }
  const std::vector<std::string> problems = all_gather_bytes(problem);
  if (mine) std::rethrow_exception(mine);
  for (int r = 0; r < static_cast<int>(problems.size()); ++r) {
    if (!problems[r].empty()) {
      throw DeviceError(fmt::format("connect({}) ({}): rank {} cannot connect: {}", device.str(), describe(), r,
                                    problems[r]));
    }
  }
  id = broadcast_bytes(id, 0);
  cuda_.emplace(device.index, backend->create_communicator(id, rank(), size()));
}

bool ProcessGroup::connected(Device device) const { return device.is_cpu() || cuda_.contains(device.index); }

// ---- the single-process group ----

std::string SingleProcessGroup::broadcast_bytes(std::string_view bytes, int root) {
  if (root != 0) {
    throw IndexError(fmt::format("broadcast_bytes ({}): root {} is not a rank of this group (only rank 0)",
                                 describe(), root));
  }
  return std::string(bytes);
}

void SingleProcessGroup::abort(int exit_code) noexcept { std::_Exit(exit_code); }

void SingleProcessGroup::cpu_all_gather(const CommBuffer& input, const CommBuffer& output, const std::string&) {
  if (input.data != output.data && input.numel > 0) {
    std::memcpy(output.data, input.data, static_cast<std::size_t>(input.numel) * dtype_size(input.dtype));
  }
}

void SingleProcessGroup::cpu_reduce_scatter(const CommBuffer& input, const CommBuffer& output, ReduceOp,
                                            const std::string&) {
  if (input.data != output.data && output.numel > 0) {
    std::memcpy(output.data, input.data, static_cast<std::size_t>(output.numel) * dtype_size(output.dtype));
  }
}

// ---- the factory ----

bool mpi_available() {
#if defined(AMPSCOPE_WITH_MPI)
  return true;
#else
  return false;
#endif
}

namespace {

// The number of processes the launcher started, or 0 when no launcher's variables are set.
long launched_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') return std::strtol(v, nullptr, 10);
  }
  if (const char* v = std::getenv("PMIX_RANK"); v != nullptr && *v != '\0') return -1;  // size unknown
  return 0;
}

}  // namespace

bool launched_by_mpi() { return launched_size() != 0; }

std::unique_ptr<ProcessGroup> make_process_group(const ProcessGroupOptions& options) {
  const long launched = launched_size();
  if (launched == 0) return std::make_unique<SingleProcessGroup>();
#if defined(AMPSCOPE_WITH_MPI)
  return detail::make_mpi_process_group(options);
#else
  if (launched == 1) return std::make_unique<SingleProcessGroup>();
  throw Error(fmt::format("make_process_group: this process was started by an MPI launcher ({} processes), but this "
                          "build of ampscope has no MPI, so the processes cannot talk to each other\nhint: install "
                          "Open MPI (apt-get install libopenmpi-dev openmpi-bin) and configure with -DAMPSCOPE_MPI=ON, "
                          "or run without mpirun",
                          launched < 0 ? std::string("an unknown number of") : std::to_string(launched)));
#endif
}

}  // namespace ampscope
