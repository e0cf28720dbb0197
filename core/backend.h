// core/backend.h: the interface every compute backend (cpu, cuda) implements, and its dispatch table.
//
// A backend owns memory on its device and a table of kernels indexed by (op, dtype). Core asks
// `supports(op, dtype)` or calls `run(op, dtype, args)`, which refuses cleanly when the kernel is
// missing ("op 'conv2d' has no bf16 kernel on backend 'cpu'"); a backend never crashes on an op it
// lacks. The dtype that selects a kernel is the dtype of the output.
//
//   Backend& be = backend_for(Device::cpu());
//   if (be.supports(Op::add, DType::f16)) be.run(Op::add, DType::f16, args);
//
// Kernels see only TensorViews and scalars (KernelArgs): no autograd, no autocast, no probes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/device.h"
#include "core/dtype.h"
#include "core/tensor_view.h"

namespace ampscope {

// Every op a backend can implement. Add an op here, in op_name() and in the backends that have it.
enum class Op : std::uint16_t {
  fill,     // out[i] = scalars[0]
  copy,     // out[i] = convert(in[0][i]): strided copy and dtype cast in one
  arange,   // out[i] = scalars[0] + i * scalars[1]
  uniform,  // out[i] = uniform [0, 1) from the Philox stream (seed, offset)
  normal,   // out[i] = standard normal from the Philox stream (seed, offset)
  add,      // out = in[0] + in[1]
  sub,      // out = in[0] - in[1]
  mul,      // out = in[0] * in[1]
  div,      // out = in[0] / in[1]
  add_scalar,  // out = in[0] + scalars[0], the scalar in the compute type
  mul_scalar,  // out = in[0] * scalars[0], the scalar in the compute type
  neg,      // out = -in[0]
  relu,     // out = max(in[0], 0), NaN kept
  exp,      // out = exp(in[0])
  kCount
};
inline constexpr int kNumOps = static_cast<int>(Op::kCount);

std::string_view op_name(Op op);

// The arguments of one kernel call. Inputs are already broadcast to the output's shape (stride 0 on
// broadcast dimensions) and on the backend's device; the output is allocated by the caller and is
// contiguous for every op but fill and copy, which also write into strided views.
struct KernelArgs {
  TensorView out;
  std::array<TensorView, 3> in{};
  int num_inputs = 0;
  std::array<double, 4> scalars{};
  std::uint64_t seed = 0;    // random ops: Philox key
  std::uint64_t offset = 0;  // random ops: first Philox block
};

class Backend;
using KernelFn = void (*)(Backend&, const KernelArgs&);

class Backend {
 public:
  virtual ~Backend() = default;
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual std::string_view name() const = 0;  // "cpu", "cuda"
  virtual Device device() const = 0;

  // Device memory. allocate throws DeviceRuntimeError (with the size asked and the memory free) when
  // the device cannot satisfy it; deallocate never throws.
  virtual void* allocate(std::size_t nbytes) = 0;
  virtual void deallocate(void* ptr, std::size_t nbytes) noexcept = 0;

  // Byte copies between host memory and this backend's memory; they complete before returning.
  virtual void copy_from_host(void* dst, const void* host_src, std::size_t nbytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, std::size_t nbytes) = 0;

  // Waits for all work queued on this backend.
  virtual void synchronize() = 0;

  bool supports(Op op, DType dtype) const { return table_[index(op)][index(dtype)] != nullptr; }

  // Runs the kernel for (op, dtype) or throws UnsupportedError naming the op, dtype and backend.
  void run(Op op, DType dtype, const KernelArgs& args);

 protected:
  // Registering the same (op, dtype) twice is a programming error and throws.
  void register_kernel(Op op, DType dtype, KernelFn fn);

 private:
  static constexpr std::size_t index(Op op) { return static_cast<std::size_t>(op); }
  static constexpr std::size_t index(DType t) { return static_cast<std::size_t>(t); }
  std::array<std::array<KernelFn, kNumDTypes>, kNumOps> table_{};
};

// The backend of a device, created on first use. Throws DeviceError when the device is not available
// (a CUDA device in a build without CUDA, or on a machine without a GPU).
Backend& backend_for(Device device);

// Whether a CUDA device can be used, and if not, why (for skip messages and `ampscope` output). CUDA
// error 100 (no device) and error 35 without a driver mean "no GPU"; error 35 with a driver installed
// means the driver is older than the runtime, and `reason` says so.
struct CudaStatus {
  bool compiled = false;  // built with AMPSCOPE_CUDA
  int device_count = 0;
  std::string reason;  // empty when usable
};
CudaStatus cuda_status();

}  // namespace ampscope
