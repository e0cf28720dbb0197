#include "core/backend.h"

#include <fmt/format.h>

#include "core/distributed/communicator.h"
#include "core/error.h"

namespace ampscope {

std::string_view op_name(Op op) {
  switch (op) {
#define AMPSCOPE_OP_NAME(name) \
  case Op::name:               \
    return #name;
    AMPSCOPE_OPS(AMPSCOPE_OP_NAME)
#undef AMPSCOPE_OP_NAME
    case Op::kCount: break;
  }
  return "?";
}

void Backend::run(Op op, DType dtype, const KernelArgs& args) {
  const KernelFn fn = table_[index(op)][index(dtype)];
  if (fn == nullptr) {
    throw UnsupportedError(fmt::format("op '{}' has no {} kernel on backend '{}'", op_name(op), dtype_name(dtype), name()));
  }
  fn(*this, args);
}

namespace {

[[noreturn]] void no_fused_amp(const Backend& backend, const char* what) {
  throw UnsupportedError(fmt::format("{}: backend '{}' has no fused AMP kernels\nhint: ask "
                                     "fused_amp_available() first and run the unfused ops when it is false",
                                     what, backend.name()));
}

}  // namespace

void Backend::fused_non_finite_check_and_unscale(const std::vector<TensorView>&, float*, float) {
  no_fused_amp(*this, "fused_non_finite_check_and_unscale");
}

void Backend::fused_sgd_step(const std::vector<FusedSgdTensor>&, const FusedSgdOptions&, const float*) {
  no_fused_amp(*this, "fused_sgd_step");
}

void Backend::fused_adam_step(const std::vector<FusedAdamTensor>&, const FusedAdamOptions&, const float*) {
  no_fused_amp(*this, "fused_adam_step");
}

void Backend::count_not_equal(const TensorView&, std::int64_t, const TensorView&) {
  throw UnsupportedError(fmt::format("count_not_equal: backend '{}' has no device count kernel\nhint: count the "
                                     "indices on the host (nll_loss does so for CPU tensors)",
                                     name()));
}

namespace {

[[noreturn]] void no_communicator(const Backend& backend, const char* what) {
  throw UnsupportedError(fmt::format("{}: backend '{}' has no communication library for collectives between "
                                     "processes\nhint: {}",
                                     what, backend.name(),
                                     backend.device().is_cpu()
                                         ? "CPU tensors go through the process group itself (MPI); only CUDA "
                                           "devices are connected with ProcessGroup::connect"
                                         : "this build's CUDA backend has no NCCL"));
}

}  // namespace

std::string Backend::new_communicator_id() { no_communicator(*this, "new_communicator_id"); }

std::unique_ptr<Communicator> Backend::create_communicator(const std::string&, int, int) {
  no_communicator(*this, "create_communicator");
}

std::unique_ptr<StatsQueue> Backend::make_stats_queue(int) { return nullptr; }

void Backend::register_kernel(Op op, DType dtype, KernelFn fn) {
  KernelFn& slot = table_[index(op)][index(dtype)];
  if (slot != nullptr) {
    throw Error(fmt::format("backend '{}': kernel for op '{}' at {} registered twice", name(), op_name(op), dtype_name(dtype)));
  }
  slot = fn;
}

}  // namespace ampscope
