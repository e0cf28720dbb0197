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
//
// Besides the per-op table, a backend may offer the fused AMP fast path (multi-tensor unscale, one-kernel
// optimizer steps); core asks `fused_amp_available()` and otherwise runs the unfused ops. This is how
// core reaches the CUDA backend's fused kernels without including any backend header.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/float8.h"
#include "core/tensor_view.h"

namespace ampscope {

// Every op a backend can implement, as an X-macro so the enum and op_name() cannot drift apart.
// Add an op here and in the backends that have it. Inputs are in[0], in[1], ...; a second or third
// output goes in aux[0], aux[1]. Integer parameters (kernel sizes, strides) travel as exact doubles.
#define AMPSCOPE_OPS(X)                                                                                       \
  /* creation and movement */                                                                                 \
  X(fill)          /* out[i] = scalars[0] */                                                                  \
  X(copy)          /* out[i] = convert(in[0][i]): strided copy and dtype cast in one */                       \
  X(arange)        /* out[i] = scalars[0] + i * scalars[1] */                                                 \
  X(uniform)       /* out[i] = uniform [0, 1) from the Philox stream (seed, offset) */                        \
  X(normal)        /* out[i] = standard normal from the Philox stream (seed, offset) */                       \
  /* element-wise, inputs broadcast to out's shape; scalars in the compute type */                           \
  X(add) X(sub) X(mul) X(div)                                                                                 \
  X(add_scalar)    /* in[0] + scalars[0] */                                                                   \
  X(mul_scalar)    /* in[0] * scalars[0] */                                                                   \
  X(neg) X(relu) X(exp) X(log) X(sqrt) X(rsqrt) X(sigmoid) X(tanh)                                            \
  X(gelu)          /* scalars[0]: 0 = erf form, 1 = tanh form */                                              \
  X(pow_scalar)    /* in[0] ** scalars[0] */                                                                  \
  X(clamp)         /* min(max(in[0], scalars[0]), scalars[1]); +-inf for an absent bound; NaN kept */         \
  X(where)         /* in[0] (bool) ? in[1] : in[2] */                                                         \
  X(masked_fill)   /* in[1] (bool) ? scalars[0] : in[0] */                                                    \
  X(relu_backward)     /* (g, y): y <= 0 ? 0 : g (PyTorch's threshold_backward; a NaN passes g) */             \
  X(gelu_backward)     /* (g, x), scalars[0] as gelu */                                                       \
  X(sigmoid_backward)  /* (g, y): g * y * (1 - y) */                                                          \
  X(tanh_backward)     /* (g, y): g * (1 - y * y) */                                                          \
  X(clamp_backward)    /* (g, x): lo <= x <= hi ? g : 0 */                                                    \
  X(bce)               /* (p, y): -(y log p + (1 - y) log(1 - p)), each log clamped at -100 */                \
  X(bce_backward)      /* (g, p, y): g (p - y) / max(p (1 - p), 1e-12) */                                     \
  X(bce_logits)        /* (x, y): (1 - y) x + log(1 + exp(-x)), computed stably */                             \
  X(bce_logits_backward) /* (g, x, y): g (sigmoid(x) - y) */                                                  \
  X(dropout)           /* in[0] x; out x * keep / (1 - p), aux[0] keep mask (bool); p = scalars[0] */         \
  X(masked_scale)      /* (g, mask): g * (mask ? 1 : 0) * scalars[0] (a dropped NaN stays NaN) */             \
  /* rows: in[0] is a contiguous [rows, cols] tensor; the reduced or normalised dimension is last */         \
  X(sum_rows)          /* out[r] = sum_c in[r, c] * scalars[0] / scalars[1] (mean: PyTorch's factor, 1) */  \
  X(argmax_rows)       /* out[r] (i64) = first index of the largest value (NaN counts as largest) */          \
  X(softmax_rows) X(log_softmax_rows)                                                                         \
  X(softmax_backward_rows)      /* (g, y): y (g - sum(g y)) */                                                \
  X(log_softmax_backward_rows)  /* (g, y): g - exp(y) sum(g) */                                               \
  X(layer_norm_rows)   /* (x, w?, b?) -> out y, aux[0] mean, aux[1] rstd (acc type); scalars[0] eps */       \
  X(layer_norm_backward_rows)   /* (g, x, mean, rstd, w?) -> out dx */                                        \
  X(layer_norm_param_grad)      /* (g, x, mean, rstd) -> out dw, aux[0] db, summed over rows */               \
  /* matrix products and windows */                                                                           \
  X(gemm)              /* out[b] = in[0][b] @ in[1][b] (+ in[2] bias: scalars[0] 0 per column, 1 per row); */ \
                       /* scalars[1] = 1: out [1, M, N] = sum over b, accumulated before the one rounding */ \
  X(im2col)            /* x [N,C,H,W] -> cols [N, C*KH*KW, OH*OW]; scalars kh kw sh sw ph pw */               \
  X(col2im)            /* cols -> dx [N,C,H,W], summed per input element; same scalars */                     \
  X(max_pool2d)        /* x -> out y, aux[0] argmax (i64, within the H*W plane); same scalars */              \
  X(max_pool2d_backward) /* (g, argmax) -> dx [N,C,H,W] */                                                    \
  X(embedding)         /* (weight [V,D], index (i64) [n]) -> [n, D] */                                        \
  X(embedding_backward) /* (g [n,D], index) -> [V, D], summed per row in index order */                        \
  X(nll_rows)          /* (logp [N,C], target (i64) [N]) -> [N]: -logp[i, t_i], 0 where t_i = scalars[0] */   \
  X(nll_backward_rows) /* (g [N], target) -> [N,C]: -g_i / scalars[1] at t_i, else 0; scalars[0] ignore */ \
  /* ops for hand-written losses (element-wise ones broadcast as above) */                                    \
  X(rsub_scalar)       /* scalars[0] - in[0] */                                                               \
  X(reciprocal)        /* 1 / in[0] */                                                                        \
  X(abs) X(log1p) X(expm1)                                                                                    \
  X(abs_backward)      /* (g, x): g * sign(x), sign(0) = sign(NaN) = 0 */                                    \
  X(logsigmoid)        /* min(x, 0) - log1p(exp(-|x|)) */                                                     \
  X(logsigmoid_backward) /* (g, x): g (max_deriv - sign z / (1 + z)), z = exp(-|x|) (PyTorch's CUDA form) */  \
  X(softplus)          /* x beta > threshold ? x : log1p(exp(x beta)) / beta; scalars beta, threshold */      \
  X(softplus_backward) /* (g, x): x beta > threshold ? g : g z / (z + 1), z = exp(x beta); same scalars */     \
  X(maximum) X(minimum) /* NaN wins (the first operand's), else the larger (smaller); ties give in[0] */      \
  X(maximum_backward)  /* (g, x, y): x == y ? g / 2 : x < y ? 0 : g (x's share of maximum(x, y)) */           \
  X(minimum_backward)  /* (g, x, y): x == y ? g / 2 : x > y ? 0 : g */                                        \
  X(std_backward)      /* (q, y): y == 0 ? 0 : q (std's masked_fill_(result == 0, 0)) */                      \
  X(max_rows)          /* out[r] = the first largest value (the first NaN), aux[0] (i64, optional) its index */ \
  X(min_rows)          /* the same with the smallest value */                                                 \
  X(var_rows)          /* out[r] = sum (x - mean)^2 / max(cols - scalars[0], 0); sqrt of it if scalars[1] = 1 */ \
  X(evenly_distribute_rows) /* (g [rows], x [rows, cols], v [rows]) -> dx: mask (g / count(mask)), mask = */ \
                       /* x == v (or both NaN when scalars[0] = 1), in the stored dtype's rounding */         \
  X(index_backward_rows) /* (g [rows], index (i64) [rows]) -> [rows, cols]: g at the index, 0 elsewhere */ \
  /* activations of loaded architectures (Llama's gated MLP) */                                              \
  X(silu)              /* x / (1 + exp(-x)) (PyTorch's CUDA form) */                                          \
  X(silu_backward)     /* (g, x): g s (1 + x (1 - s)), s = 1 / (1 + exp(-x)) */

enum class Op : std::uint16_t {
#define AMPSCOPE_OP_ENUM(name) name,
  AMPSCOPE_OPS(AMPSCOPE_OP_ENUM)
#undef AMPSCOPE_OP_ENUM
  kCount
};
inline constexpr int kNumOps = static_cast<int>(Op::kCount);

std::string_view op_name(Op op);

// The arguments of one kernel call. For element-wise ops the inputs are already broadcast to the
// output's shape (stride 0 on broadcast dimensions) and the output is contiguous (fill and copy also
// write into strided views). Other ops document their shapes above; a missing optional input has
// data == nullptr. gemm: in[0] is [B, M, K], in[1] is [B, K, N], any strides (a batch stride of 0
// shares one matrix); out is [B, M, N] contiguous; products accumulate in float (double for f64).
struct KernelArgs {
  TensorView out;
  std::array<TensorView, 2> aux{};
  std::array<TensorView, 5> in{};
  int num_inputs = 0;
  std::array<double, 8> scalars{};
  std::uint64_t seed = 0;    // random ops: Philox key
  std::uint64_t offset = 0;  // random ops: first Philox block
};

// ---- device statistics (optional; the probe's statistics without a host sync per op) ----
// The statistics of one tensor as a device computed them: counts, min/max/absmax and the sums for mean
// and rms of the finite values (in double), and the exponent histogram (the bins of probes/trace/schema.h
// kHistBins, which the probe checks against kDeviceStatsBins: core may not include probes/). Plain data.
inline constexpr int kDeviceStatsBins = 132;
struct DeviceStatsResult {
  std::uint64_t numel = 0, nan = 0, pos_inf = 0, neg_inf = 0, zero = 0, subnormal = 0;
  double min = 0, max = 0, absmax = 0, sum = 0, sum_sq = 0;
  std::array<std::uint64_t, kDeviceStatsBins> histogram{};
};

// A ring of result slots on a backend's device (Backend::make_stats_queue). launch() queues the statistics
// of a tensor behind the work already queued on the backend and returns at once; read() waits for that
// slot only. A slot launched and not yet read stays taken: launch() answers -1 when every slot is taken,
// and the caller reads (and so frees) slots before launching more. Slots are freed by read() in any order.
class StatsQueue {
 public:
  virtual ~StatsQueue() = default;
  virtual int capacity() const = 0;
  virtual int free_slots() const = 0;
  // f32, f64, f16 and bf16 tensors; the slot, or -1 when the ring is full. Throws DTypeError for other
  // dtypes.
  virtual int launch(const TensorView& t, bool histogram) = 0;
  // Waits for the slot's result (the first read of a batch of slots is the one host sync that batch costs);
  // the slot is free again afterwards. Throws IndexError for a slot that holds no launch.
  virtual DeviceStatsResult read(int slot) = 0;
};

class Backend;
class Communicator;  // core/distributed/communicator.h
using KernelFn = void (*)(Backend&, const KernelArgs&);

// The arguments of the fused AMP fast path (Backend::fused_sgd_step, fused_adam_step); the exact
// semantics, which are the unfused per-op path's bits, are documented with the CUDA kernels
// (kernels/cuda/fused_amp.h, docs/cuda.md).
//
// One parameter of a fused SGD step. All f32, contiguous, the same numel. momentum_buffer: null data
// when momentum is 0; first_step: the buffer is written from the gradient (PyTorch's buf = g.clone()).
struct FusedSgdTensor {
  TensorView param, grad, momentum_buffer;
  bool first_step = false;
};
struct FusedSgdOptions {
  double lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false, maximize = false;
};
// One parameter of a fused Adam/AdamW step. All f32, contiguous, the same numel; max_exp_avg_sq only
// with amsgrad. step is the step count after this step's increment (the bias corrections are computed
// from it in double on the host, as the unfused path does).
struct FusedAdamTensor {
  TensorView param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq;
  std::int64_t step = 1;
};
struct FusedAdamOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool amsgrad = false, maximize = false;
  bool decoupled_weight_decay = false;  // AdamW
};

// The FP8 kernels of a device backend (core/fp8_linear.h's quantization and scaled GEMMs on a GPU; the CPU
// computes them in core/fp8_linear.cpp itself). Reached through fp8_device_kernels(device) below; the CUDA
// ones and what each matches of the CPU are in kernels/cuda/fp8_cuda.h and docs/cuda.md.
//
// One operand quantized: codes[i] = satfinite(RNE(float(x[i]) * scale)) in row-major order, and
// *amax = max(*amax, fmaxf-fold of |float(x[i])|) (NaN skipped, an inf wins), the caller zeroing it first.
struct Fp8QuantizeArgs {
  TensorView x;                   // 2-D, f64/f32/f16/bf16, any strides, on the backend's device
  std::uint8_t* codes = nullptr;  // x.numel bytes of device memory
  float* amax = nullptr;          // one device f32
  float scale = 1.0f;
  Fp8Format format = Fp8Format::e4m3;
};
// One scaled GEMM: out[i][j] = round(sum_p op(A)[i][p] op(B)[p][j] * alpha + bias[j]), op(X) = X or X^T of
// the row-major code matrices, the product of decoded values accumulated in f32.
struct Fp8GemmArgs {
  const std::uint8_t* a = nullptr;  // [a_rows, a_cols] codes, device memory, row-major
  std::int64_t a_rows = 0, a_cols = 0;
  Fp8Format a_format = Fp8Format::e4m3;
  bool transpose_a = false;
  const std::uint8_t* b = nullptr;
  std::int64_t b_rows = 0, b_cols = 0;
  Fp8Format b_format = Fp8Format::e4m3;
  bool transpose_b = false;
  float alpha = 1.0f;       // scale_inv_a * scale_inv_b, one f32 product made by the caller
  TensorView bias;          // null data, or J contiguous f32 values on the device
  TensorView out;           // [I, J] contiguous, f32/f16/bf16, on the device
  bool fast_accumulation = false;  // TransformerEngine's fprop setting (no split accumulator), cuBLASLt only
};
struct Fp8DeviceKernels {
  void (*quantize)(Backend& backend, const Fp8QuantizeArgs& args);
  void (*gemm)(Backend& backend, const Fp8GemmArgs& args);
};

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

  // Calls fn(begin, end) on disjoint chunks covering [0, n), each at least `grain` long where possible, on the
  // host threads this backend's kernels use (the CPU backend: its pool, kernels/parallel.h), and returns when
  // all are done; an exception from fn is rethrown. For host loops core runs itself (core/fp8_linear.cpp's
  // FP8 GEMM), which cannot include a backend. The default runs fn(0, n) on the calling thread.
  virtual void parallel_for(std::int64_t n, std::int64_t grain,
                            const std::function<void(std::int64_t, std::int64_t)>& fn) {
    if (n > 0) fn(0, n);
  }

  bool supports(Op op, DType dtype) const { return table_[index(op)][index(dtype)] != nullptr; }

  // Runs the kernel for (op, dtype) or throws UnsupportedError naming the op, dtype and backend.
  void run(Op op, DType dtype, const KernelArgs& args);

  // ---- the fused AMP fast path (optional) ----
  // Whether core should use the fused AMP kernels for this backend's tensors now. False by default; the
  // CUDA backend says true when its fused kernels are switched on (AMPSCOPE_FUSED_AMP=1, docs/cuda.md).
  // When false, GradScaler and the optimizers run their unfused per-op path.
  virtual bool fused_amp_available() const { return false; }
  // Whether the optimizers should use fused_sgd_step/fused_adam_step for this backend's f32 parameters
  // now. The same as fused_amp_available() unless a backend has fused optimizer steps without the rest
  // of the fast path (the CPU backend: kernels/cpu/fused_optim.h).
  virtual bool fused_optimizer_available() const { return fused_amp_available(); }
  // _amp_foreach_non_finite_check_and_unscale_ over `grads` in one pass: *found_inf (one f32 in this
  // backend's memory) is set to 1 when any element is inf or NaN, and every grad is multiplied in place
  // by inv_scale. The steps: one SGD or Adam/AdamW step over a group; found_inf is null or a device f32
  // that skips the whole step when non-zero. A backend without the fast path throws UnsupportedError.
  virtual void fused_non_finite_check_and_unscale(const std::vector<TensorView>& grads, float* found_inf,
                                                  float inv_scale);
  virtual void fused_sgd_step(const std::vector<FusedSgdTensor>& tensors, const FusedSgdOptions& options,
                              const float* found_inf);
  virtual void fused_adam_step(const std::vector<FusedAdamTensor>& tensors, const FusedAdamOptions& options,
                               const float* found_inf);

  // ---- statistics on the device and host synchronisations (optional) ----
  // A ring of `slots` statistics slots on this backend's stream, or null when this backend has none (the
  // CPU backend: its tensors are read in place, probes/stats.h). The CUDA backend's ring is
  // kernels/cuda/stats_cuda.h's StatsBuffer.
  virtual std::unique_ptr<StatsQueue> make_stats_queue(int slots);
  // How many times the host has waited for this backend's device so far (synchronize(), the blocking
  // copies, statistics reads, error-flag checks): a counter for tests and benchmarks that the probe and
  // the fused AMP path keep to a constant number per step (docs/cuda.md, "What synchronises"). 0 for
  // the CPU backend, which never waits.
  virtual std::int64_t host_syncs() const { return 0; }

  // ---- nll_loss's mean divisor on the device (optional) ----
  // Queues, behind the work already queued and without waiting, the count of the `indices` (i64,
  // contiguous, this backend's memory) that differ from `ignore`, rounded once to out's dtype (f32 or f64;
  // one element in this backend's memory). nll_loss with mean divides by it on a GPU, where copying the
  // targets to the host to count them would cost a wait per call (docs/cuda.md, "What synchronises"); the
  // CPU path counts on the host while it checks the targets. The default throws UnsupportedError.
  virtual void count_not_equal(const TensorView& indices, std::int64_t ignore, const TensorView& out);

  // ---- collectives between processes (optional; core/distributed/communicator.h) ----
  // How ProcessGroup::connect (core/distributed/process_group.h) reaches a device's communication library (NCCL for
  // CUDA) without including a backend header. new_communicator_id: a fresh id for a new communicator
  // (called on one rank, which sends it to the others); create_communicator: this process's member of
  // the communicator with that id, as `rank` of `size` (collective: every rank calls it). A backend
  // without one (the CPU backend: its tensors go through the process group itself) throws
  // UnsupportedError.
  virtual std::string new_communicator_id();
  virtual std::unique_ptr<Communicator> create_communicator(const std::string& id, int rank, int size);

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

// The FP8 kernels of `device`'s backend, or null where there are none (the CPU; a build without CUDA).
const Fp8DeviceKernels* fp8_device_kernels(Device device);

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
