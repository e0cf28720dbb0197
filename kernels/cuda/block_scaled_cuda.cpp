// Host side of the block-scaled conversion kernels (kernels/cuda/block_scaled_cuda.h): shape checks with the CPU's
// errors, ordering against the backend, the launches.
#include "kernels/cuda/block_scaled_cuda.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "core/block_scaled_elements.h"
#include "core/error.h"
#include "kernels/cuda/block_scaled_launch.h"
#include "kernels/cuda/cuda_check.h"

namespace ampscope::cuda {
namespace {

// Ordered after the backend's queued work, on this thread's default stream (as fp8_cuda.cpp: the backend does
// not export its stream yet); the caller drains it before returning.
cudaStream_t begin_ordered(Backend& backend, const char* what) {
  const Device device = backend.device();
  if (!device.is_cuda()) {
    throw DeviceError(fmt::format("{}: backend '{}' is not a CUDA backend", what, backend.name()));
  }
  backend.synchronize();
  AMPSCOPE_CUDA_CHECK(cudaSetDevice(device.index));
  return cudaStreamPerThread;
}

void check_launch(cudaError_t status, const char* kernel) {
  if (status != cudaSuccess) check(status, fmt::format("launch of kernel '{}'", kernel));
}

void finish(cudaStream_t stream) { AMPSCOPE_CUDA_CHECK(cudaStreamSynchronize(stream)); }

std::uint64_t size_of(std::int64_t rows, std::int64_t cols) {
  return rows < 0 || cols < 0 ? 0 : static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(cols);
}

}  // namespace

void mxfp8_quantize(Backend& backend, const MxQuantizeDeviceArgs& args) {
  const char* what = "quantize_mxfp8 (CUDA)";
  check_block_matrix(what, size_of(args.rows, args.cols), args.rows, args.cols);
  check_mx_shape(what, args.rows, args.cols, args.options.axis);
  const cudaStream_t stream = begin_ordered(backend, what);
  check_launch(launch_mx_quantize(args.x, args.rows, args.cols, args.options.axis, args.options.element,
                                  args.options.rule, args.codes, args.scales, stream),
               "mx_quantize");
  finish(stream);
}

void mxfp8_dequantize(Backend& backend, const MxDequantizeDeviceArgs& args) {
  const char* what = "dequantize_mxfp8 (CUDA)";
  check_block_matrix(what, size_of(args.rows, args.cols), args.rows, args.cols);
  check_mx_shape(what, args.rows, args.cols, args.options.axis);
  const cudaStream_t stream = begin_ordered(backend, what);
  check_launch(launch_mx_dequantize(args.codes, args.scales, args.rows, args.cols, args.options.axis,
                                    args.options.element, args.out, stream),
               "mx_dequantize");
  finish(stream);
}

void nvfp4_quantize(Backend& backend, const Nvfp4QuantizeDeviceArgs& args) {
  const char* what = "quantize_nvfp4 (CUDA)";
  check_block_matrix(what, size_of(args.rows, args.cols), args.rows, args.cols);
  check_nvfp4_shape(what, args.rows, args.cols, args.options.tile);
  const cudaStream_t stream = begin_ordered(backend, what);
  // Two 64-bit words for the amax reduction, from the backend; returned after this stream is drained.
  struct Scratch {
    Backend& backend;
    void* ptr;
    ~Scratch() { backend.deallocate(ptr, 2 * sizeof(unsigned long long)); }
  } scratch{backend, backend.allocate(2 * sizeof(unsigned long long))};
  // The pool allocates in the backend's stream order; this stream may use the memory once that point is reached.
  backend.synchronize();
  cudaError_t status = launch_nvfp4_global_scales(args.x, args.rows * args.cols,
                                                  static_cast<unsigned long long*>(scratch.ptr), args.globals, stream);
  if (status == cudaSuccess) {
    status = launch_nvfp4_quantize(args.x, args.rows, args.cols, args.options.tile, args.options.stochastic_rounding,
                                   args.options.stream.seed, args.options.stream.offset, args.globals, args.codes,
                                   args.scales, stream);
  }
  // Drained before the scratch goes back, whether or not a launch failed.
  const cudaError_t drained = cudaStreamSynchronize(stream);
  check_launch(status, "nvfp4_global_scales / nvfp4_quantize");
  AMPSCOPE_CUDA_CHECK(drained);
}

void nvfp4_dequantize(Backend& backend, const Nvfp4DequantizeDeviceArgs& args) {
  const char* what = "dequantize_nvfp4 (CUDA)";
  check_block_matrix(what, size_of(args.rows, args.cols), args.rows, args.cols);
  check_nvfp4_shape(what, args.rows, args.cols, args.tile);
  const cudaStream_t stream = begin_ordered(backend, what);
  check_launch(launch_nvfp4_dequantize(args.codes, args.scales, args.rows, args.cols, args.tile, args.globals + 2,
                                       args.out, stream),
               "nvfp4_dequantize");
  finish(stream);
}

namespace {

void run_rht(Backend& backend, const char* what, const float* in, std::int64_t n, bool inverse, float* out) {
  if (n < 0) throw ShapeError(fmt::format("{}: a negative length ({})\nhint: pass the number of values", what, n));
  check_rht_length(what, static_cast<std::uint64_t>(n));
  const cudaStream_t stream = begin_ordered(backend, what);
  check_launch(launch_rht16(in, n, inverse, out, stream), "rht16");
  finish(stream);
}

}  // namespace

void random_hadamard_transform(Backend& backend, const float* x, std::int64_t n, float* y) {
  run_rht(backend, "random_hadamard_transform (CUDA)", x, n, false, y);
}

void inverse_random_hadamard_transform(Backend& backend, const float* y, std::int64_t n, float* x) {
  run_rht(backend, "inverse_random_hadamard_transform (CUDA)", y, n, true, x);
}

}  // namespace ampscope::cuda
