#include "core/tensor.h"

#include <algorithm>
#include <array>
#include <tuple>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/convert.h"
#include "core/error.h"
#include "core/ops.h"

namespace ampscope {

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

namespace {

// Whether an op on t would be recorded (the cheap test, before any lambda is built).
bool tracks(const Tensor& t) { return grad_enabled() && t.requires_grad(); }

// In-place writes into a tensor that is part of a graph would silently change what backward computes.
void check_in_place(const Tensor& t, std::string_view op) {
  if (tracks(t)) {
    throw Error(fmt::format("{}: {} requires grad; writing into it in place would corrupt the autograd graph\n"
                            "hint: do the update inside a NoGradGuard (as optimizers do), or on a detach()ed copy",
                            op, t.name().empty() ? "the tensor" : fmt::format("'{}'", t.name())));
  }
}

Shape contiguous_strides(const Shape& sizes) {
  Shape strides(sizes.size());
  std::int64_t s = 1;
  for (std::size_t i = sizes.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<std::int64_t>(sizes[i], 1);
  }
  return strides;
}

std::int64_t shape_numel(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
}

// Wraps a possibly negative dimension into [0, ndim), or throws naming the op.
std::int64_t wrap_dim(std::int64_t d, std::int64_t ndim, std::string_view op, const Shape& shape) {
  if (d < -ndim || d >= ndim || ndim == 0) {
    throw IndexError(fmt::format("{}: dimension {} is out of range for a tensor of shape {} (valid: {} to {})", op, d,
                                 shape_str(shape), -ndim, ndim - 1));
  }
  return d < 0 ? d + ndim : d;
}

void check_shape(const Shape& shape, std::string_view op) {
  for (std::int64_t s : shape) {
    if (s < 0) throw ShapeError(fmt::format("{}: negative size in shape {}", op, shape_str(shape)));
  }
  if (shape.size() > static_cast<std::size_t>(kMaxDims)) {
    throw ShapeError(fmt::format("{}: shape {} has {} dimensions; at most {} are supported", op, shape_str(shape),
                                 shape.size(), kMaxDims));
  }
}

// Strides that let a tensor of (sizes, strides) be viewed with new_sizes without copying, if any.
// Dimensions of the old tensor that are laid out contiguously with respect to each other form chunks;
// each chunk must be covered exactly by a run of new dimensions, which then step through it at the
// chunk's innermost stride.
std::optional<Shape> view_strides(const Shape& sizes, const Shape& strides, const Shape& new_sizes) {
  const std::int64_t numel = shape_numel(sizes);
  if (numel == 0 || sizes.empty()) return contiguous_strides(new_sizes);
  Shape out(new_sizes.size(), 0);
  std::int64_t view_d = static_cast<std::int64_t>(new_sizes.size()) - 1;
  std::int64_t chunk_stride = strides.back();
  std::int64_t chunk_numel = 1;
  std::int64_t view_numel = 1;
  for (std::int64_t d = static_cast<std::int64_t>(sizes.size()) - 1; d >= 0; --d) {
    chunk_numel *= sizes[d];
    const bool chunk_ends = d == 0 || (sizes[d - 1] != 1 && strides[d - 1] != chunk_numel * chunk_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < chunk_numel || new_sizes[view_d] == 1)) {
      out[view_d] = view_numel * chunk_stride;
      view_numel *= new_sizes[view_d];
      --view_d;
    }
    if (view_numel != chunk_numel) return std::nullopt;
    if (d > 0) {
      chunk_stride = strides[d - 1];
      chunk_numel = 1;
      view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

// Resolves one -1 in a requested shape, or throws naming both element counts.
Shape infer_shape(const Shape& requested, std::int64_t numel, std::string_view op, const Shape& from) {
  Shape shape = requested;
  std::int64_t known = 1;
  std::optional<std::size_t> infer;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer) throw ShapeError(fmt::format("{}: only one dimension can be -1, got {}", op, shape_str(requested)));
      infer = i;
    } else if (shape[i] < 0) {
      throw ShapeError(fmt::format("{}: invalid size {} in shape {}", op, shape[i], shape_str(requested)));
    } else {
      known *= shape[i];
    }
  }
  if (infer) {
    if (known == 0 || numel % known != 0) {
      throw ShapeError(fmt::format("{}: cannot view shape {} ({} elements) as {}", op, shape_str(from), numel,
                                   shape_str(requested)));
    }
    shape[*infer] = numel / known;
  } else if (known != numel) {
    throw ShapeError(fmt::format("{}: cannot view shape {} ({} elements) as {} ({} elements)", op, shape_str(from), numel,
                                 shape_str(requested), known));
  }
  return shape;
}

}  // namespace

// ---- Storage ----

namespace {
// Storage serial numbers: 64 bits do not wrap in a process's life.
std::atomic<std::uint64_t> next_storage_serial{1};
}  // namespace

Storage::Storage(Backend& backend, std::size_t nbytes)
    : backend_(&backend),
      nbytes_(nbytes),
      data_(backend.allocate(nbytes)),
      serial_(next_storage_serial.fetch_add(1, std::memory_order_relaxed)) {}

Storage::~Storage() { backend_->deallocate(data_, nbytes_); }

// ---- Tensor: basics ----

const detail::TensorImpl& Tensor::impl() const {
  if (!impl_) throw Error("use of an undefined tensor (default-constructed, or moved from)");
  return *impl_;
}

Tensor Tensor::empty(const Shape& shape, TensorOptions options) {
  check_shape(shape, "empty");
  options.dtype = autograd::widened_dtype(options.dtype);  // f32 under WidenToF32 (the f32 twin's backward)
  Backend& backend = backend_for(options.device);
  auto impl = std::make_shared<detail::TensorImpl>();
  const std::int64_t n = shape_numel(shape);
  impl->storage = std::make_shared<Storage>(backend, static_cast<std::size_t>(n) * dtype_size(options.dtype));
  impl->sizes = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = options.dtype;
  return Tensor(std::move(impl));
}

std::int64_t Tensor::size(std::int64_t d) const { return shape()[wrap_dim(d, dim(), "size", shape())]; }

std::int64_t Tensor::numel() const { return shape_numel(shape()); }

bool Tensor::is_contiguous() const {
  const detail::TensorImpl& t = impl();
  std::int64_t expected = 1;
  for (std::size_t i = t.sizes.size(); i-- > 0;) {
    if (t.sizes[i] != 1 && t.strides[i] != expected) return false;
    expected *= t.sizes[i];
  }
  return true;
}

bool Tensor::shares_storage_with(const Tensor& other) const {
  return defined() && other.defined() && impl_->storage == other.impl_->storage;
}

void* Tensor::data() const {
  const detail::TensorImpl& t = impl();
  return static_cast<char*>(t.storage->data()) + t.offset * static_cast<std::int64_t>(dtype_size(t.dtype));
}

const void* Tensor::read_data() const {
  const detail::TensorImpl& t = impl();
  return static_cast<const char*>(t.storage->read_data()) +
         t.offset * static_cast<std::int64_t>(dtype_size(t.dtype));
}

std::uint64_t Tensor::storage_serial() const { return impl().storage->serial(); }

std::uint64_t Tensor::storage_version() const { return impl().storage->version(); }

bool Tensor::copied_from(StorageCopy& from) const {
  const detail::TensorImpl& t = impl();
  if (!t.storage->copy_source(from)) return false;
  // The whole storage, in its own layout: what clone made.
  return t.offset == 0 && t.dtype == from.dtype && numel() == from.numel && is_contiguous();
}

TensorView Tensor::kernel_view() const {
  const detail::TensorImpl& t = impl();
  check_shape(t.sizes, "kernel_view");
  TensorView v;
  v.data = data();
  v.dtype = t.dtype;
  v.ndim = static_cast<int>(t.sizes.size());
  v.numel = numel();
  for (int d = 0; d < v.ndim; ++d) {
    v.sizes[d] = t.sizes[d];
    v.strides[d] = t.strides[d];
  }
  return v;
}

Tensor Tensor::make_view(Shape sizes, Shape strides, std::int64_t offset) const {
  auto impl = std::make_shared<detail::TensorImpl>();
  impl->storage = this->impl().storage;
  impl->offset = offset;
  impl->sizes = std::move(sizes);
  impl->strides = std::move(strides);
  impl->dtype = this->impl().dtype;
  // A view is the same values: the op that wrote them is its producer too (views are not reported ops).
  impl->producer_step = this->impl().producer_step;
  impl->producer_seq = this->impl().producer_seq;
  return Tensor(std::move(impl));
}

// ---- kernel calls ----

namespace {
constexpr std::size_t kMaxInputs = std::tuple_size_v<decltype(KernelArgs::in)>;

// Whether `kernel` on `device`, writing f32, reads an f16/bf16 input exactly as it reads that input widened to
// f32: the CPU's matrix product packs every operand BLAS cannot read in place into a dense row-major f32 buffer
// (kernels/cpu/nn_kernels.cpp gemm_kernel, pack_matrix), and widening first gives a dense row-major f32 tensor,
// which BLAS then reads in place as the same rows (no transpose, leading dimension its row length): one
// sgemm call on the same values either way. Not the GPU's: cuBLAS may choose another algorithm for f16 inputs.
bool reads_half_as_f32(Op kernel, const Device& device) { return kernel == Op::gemm && device.is_cpu(); }

// Under autograd::WidenToF32, an f16/bf16 input of any kernel but a copy (which converts exactly, and is how
// the input is widened) is widened to f32 into `slot` (under WidenTo(f64), an f16/bf16/f32 input to f64);
// otherwise the input itself. A broadcast view (stride 0,
// a weight expanded over the batch) is widened once and expanded again, not copied once per batch entry. A
// kernel that widens its inputs itself, to the same values and the same arithmetic (reads_half_as_f32), is
// given the input as it is: the twin's backward of a matrix product or convolution then makes no f32 copy of
// its saved operands (bench/RESULTS.md, twin_train_bench).
const Tensor& widen_input(const Tensor& in, Op kernel, Tensor& slot) {
  const std::optional<DType> to = autograd::widening_target();
  if (!to || kernel == Op::copy || autograd::widened_dtype(in.dtype()) == in.dtype()) return in;
  if (*to == DType::f32 && reads_half_as_f32(kernel, in.device())) return in;
  Tensor compact = in;
  for (std::int64_t d = 0; d < in.dim(); ++d) {
    if (in.strides()[static_cast<std::size_t>(d)] == 0 && in.size(d) > 1) compact = compact.slice(d, 0, 1);
  }
  slot = compact.to(*to);
  if (slot.shape() != in.shape()) slot = slot.expand(in.shape());
  return slot;
}
}  // namespace

void run_kernel(std::string_view op, Op kernel, const Tensor& out, std::initializer_list<Tensor> inputs,
                std::initializer_list<double> scalars, std::uint64_t seed, std::uint64_t offset) {
  KernelArgs args;
  args.out = out.kernel_view();
  args.num_inputs = static_cast<int>(inputs.size());
  // Devices are named in argument order: the first input's (where the output lives) first.
  const Device expected = inputs.size() > 0 ? inputs.begin()->device() : out.device();
  std::array<Tensor, kMaxInputs> widened;  // under WidenToF32: f16/bf16 inputs widened, alive until the kernel ran
  int i = 0;
  for (const Tensor& input : inputs) {
    const Tensor& in = widen_input(input, kernel, widened.at(static_cast<std::size_t>(i)));
    if (in.device() != expected || in.device() != out.device()) {
      const Device other = in.device() != expected ? in.device() : out.device();
      throw DeviceError(fmt::format("{}: expected all tensors on the same device, got {} and {}\n"
                                    "hint: move one of them with .to(Device::parse(\"{}\"))",
                                    op, expected.str(), other.str(), expected.str()));
    }
    args.in.at(i++) = in.shape() == out.shape() ? in.kernel_view() : in.expand(out.shape()).kernel_view();
  }
  std::size_t s = 0;
  for (double v : scalars) args.scalars.at(s++) = v;
  args.seed = seed;
  args.offset = offset;
  if (args.out.numel == 0) return;
  backend_for(out.device()).run(kernel, out.dtype(), args);
}

void run_kernel_general(std::string_view op, Op kernel, std::initializer_list<Tensor> outputs,
                        std::initializer_list<Tensor> inputs, std::initializer_list<double> scalars,
                        std::uint64_t seed, std::uint64_t offset) {
  if (outputs.size() == 0 || outputs.size() > 3 || inputs.size() > 5 || scalars.size() > 8) {
    throw Error(fmt::format("{}: run_kernel_general takes 1-3 outputs, up to 5 inputs and 8 scalars", op));
  }
  const Tensor& first = *outputs.begin();
  const Device device = first.device();
  KernelArgs args;
  int i = 0;
  for (const Tensor& t : outputs) {
    if (t.device() != device) {
      throw DeviceError(fmt::format("{}: expected all tensors on {}, got one on {}", op, device.str(), t.device().str()));
    }
    if (i == 0) {
      args.out = t.kernel_view();
    } else {
      args.aux.at(i - 1) = t.kernel_view();
    }
    ++i;
  }
  i = 0;
  std::array<Tensor, kMaxInputs> widened;  // under WidenToF32: f16/bf16 inputs widened, alive until the kernel ran
  for (const Tensor& input : inputs) {
    const Tensor& t = input.defined() ? widen_input(input, kernel, widened.at(static_cast<std::size_t>(i))) : input;
    if (t.defined()) {
      if (t.device() != device) {
        throw DeviceError(fmt::format("{}: expected all tensors on the same device, got {} and {}\n"
                                      "hint: move one of them with .to(Device::parse(\"{}\"))",
                                      op, device.str(), t.device().str(), device.str()));
      }
      args.in.at(i) = t.kernel_view();
    }
    ++i;
  }
  args.num_inputs = static_cast<int>(inputs.size());
  std::size_t s = 0;
  for (double v : scalars) args.scalars.at(s++) = v;
  args.seed = seed;
  args.offset = offset;
  bool empty = true;
  for (const Tensor& t : outputs) empty = empty && t.numel() == 0;
  if (empty) return;
  backend_for(device).run(kernel, first.dtype(), args);
}

// ---- copies and conversions ----

Tensor& Tensor::copy_(const Tensor& src) {
  check_in_place(*this, "copy_");
  if (tracks(src)) {
    // The copy would carry src's values but not its gradient path: the gradient would silently stop here.
    throw Error(fmt::format("copy_: the source {}requires grad, and copying it into a tensor outside the graph "
                            "would silently cut its gradient\nhint: use the result itself (or clone() it), or "
                            "copy a detach()ed source inside a NoGradGuard if no gradient should flow",
                            src.name().empty() ? "" : fmt::format("'{}' ", src.name())));
  }
  if (src.shape() != shape()) {
    throw ShapeError(fmt::format("copy_: source shape {} does not match destination shape {}", shape_str(src.shape()),
                                 shape_str(shape())));
  }
  for (std::size_t d = 0; d < shape().size(); ++d) {
    if (strides()[d] == 0 && shape()[d] > 1) {
      throw ShapeError(fmt::format("copy_: the destination (shape {}, strides {}) has elements that share memory "
                                   "(an expanded view), so the result would depend on write order\n"
                                   "hint: copy into a clone() or contiguous() tensor instead",
                                   shape_str(shape()), shape_str(strides())));
    }
  }
  if (src.device() == device()) {
    run_kernel("copy_", Op::copy, *this, {src});
    return *this;
  }
  // Across devices the bytes travel contiguous and in the source dtype; the cast (if any) and any
  // strided scatter happen on the destination.
  const Tensor moved = src.to(device());
  run_kernel("copy_", Op::copy, *this, {moved});
  return *this;
}

std::pair<std::int64_t, std::int64_t> Tensor::producer() const {
  const detail::TensorImpl& i = impl();
  return {i.producer_step, i.producer_seq};
}

void Tensor::set_producer(std::int64_t step, std::int64_t seq) const {
  impl();  // throws on an undefined tensor
  impl_->producer_step = step;
  impl_->producer_seq = seq;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), {dtype(), device()});
  // The source as it is before the copy: the copy's own request for its pointer changes its version, and
  // nothing else runs on this thread in between (a write from another thread meanwhile would race with
  // the copy itself).
  const StorageCopy from{storage_serial(), storage_version(), storage_offset(), numel(), dtype()};
  run_kernel("clone", Op::copy, out, {*this});
  // Same dtype (WidenToF32 may have made `out` f32) and a contiguous source: `out` holds the same values
  // in the same order, so its statistics are the source's.
  if (out.dtype() == dtype() && is_contiguous()) out.impl_->storage->note_copy(from);
  out.set_producer(impl().producer_step, impl().producer_seq);  // the same values (clone is not a reported op)
  if (!tracks(*this)) return out;
  return autograd::record("clone", out, {*this}, [](const Tensor& g, const std::vector<bool>&) {
    return std::vector<Tensor>{g};
  });
}

Tensor Tensor::to(DType target) const {
  target = autograd::widened_dtype(target);  // f32 under WidenToF32 (the f32 twin's backward)
  if (target == dtype()) return *this;
  // A cast the user asks for is an op probes see ("to"), so they can count what it overflowed.
  detail::OpDispatch dispatch("to", {*this});
  Tensor out = empty(shape(), {target, device()});
  run_kernel("to", Op::copy, out, {*this});
  if (tracks(*this)) {
    // A cast's backward casts the gradient back: an f32 parameter used through an f16 cast gets an f32 grad.
    const DType source = dtype();
    out = autograd::record("to", out, {*this}, [source](const Tensor& g, const std::vector<bool>&) {
      return std::vector<Tensor>{g.to(source)};
    });
  }
  return dispatch.finish(out);
}

Tensor Tensor::to(Device target) const {
  if (target == device()) return *this;
  if (tracks(*this)) {
    const Device source = device();
    Tensor out = detach().to(target);
    return autograd::record("to", out, {*this}, [source](const Tensor& g, const std::vector<bool>&) {
      return std::vector<Tensor>{g.to(source)};
    });
  }
  const Tensor src = contiguous();
  Tensor out = empty(shape(), {dtype(), target});
  const std::size_t nbytes = static_cast<std::size_t>(numel()) * dtype_size(dtype());
  if (src.device().is_cpu()) {
    out.impl().storage->backend().copy_from_host(out.data(), src.data(), nbytes);
  } else if (target.is_cpu()) {
    src.impl().storage->backend().copy_to_host(out.data(), src.data(), nbytes);
  } else {  // between two GPUs: through host memory (rare; not a hot path)
    std::vector<char> staging(nbytes);
    src.impl().storage->backend().copy_to_host(staging.data(), src.data(), nbytes);
    out.impl().storage->backend().copy_from_host(out.data(), staging.data(), nbytes);
  }
  return out;
}

Tensor& Tensor::fill_(double value) {
  check_in_place(*this, "fill_");
  run_kernel("fill_", Op::fill, *this, {}, {value});
  return *this;
}

// ---- views ----

Tensor Tensor::view(const Shape& requested) const {
  const Shape sizes = infer_shape(requested, numel(), "view", shape());
  check_shape(sizes, "view");
  std::optional<Shape> strides = view_strides(shape(), this->strides(), sizes);
  if (!strides) {
    throw ShapeError(fmt::format("view: a tensor of shape {} with strides {} cannot be viewed as {} without a copy\n"
                                 "hint: use reshape(), which copies when it must, or call contiguous() first",
                                 shape_str(shape()), shape_str(this->strides()), shape_str(sizes)));
  }
  return view_result("view", make_view(sizes, std::move(*strides), storage_offset()));
}

Tensor Tensor::reshape(const Shape& requested) const {
  const Shape sizes = infer_shape(requested, numel(), "reshape", shape());
  check_shape(sizes, "reshape");
  if (std::optional<Shape> strides = view_strides(shape(), this->strides(), sizes)) {
    return view_result("reshape", make_view(sizes, std::move(*strides), storage_offset()));
  }
  return clone().view(sizes);
}

Tensor Tensor::transpose(std::int64_t d0, std::int64_t d1) const {
  const std::int64_t a = wrap_dim(d0, dim(), "transpose", shape());
  const std::int64_t b = wrap_dim(d1, dim(), "transpose", shape());
  Shape sizes = shape(), strides = this->strides();
  std::swap(sizes[a], sizes[b]);
  std::swap(strides[a], strides[b]);
  Tensor out = make_view(std::move(sizes), std::move(strides), storage_offset());
  if (!tracks(*this)) return out;
  return autograd::record("transpose", out, {*this}, [a, b](const Tensor& g, const std::vector<bool>&) {
    return std::vector<Tensor>{g.transpose(a, b)};
  });
}

Tensor Tensor::permute(const Shape& dims) const {
  if (static_cast<std::int64_t>(dims.size()) != dim()) {
    throw ShapeError(fmt::format("permute: got {} dimensions {} for a tensor of shape {} with {} dimensions", dims.size(),
                                 shape_str(dims), shape_str(shape()), dim()));
  }
  Shape sizes(dims.size()), strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const std::int64_t d = wrap_dim(dims[i], dim(), "permute", shape());
    if (seen[d]) throw ShapeError(fmt::format("permute: dimension {} appears twice in {}", d, shape_str(dims)));
    seen[d] = true;
    sizes[i] = shape()[d];
    strides[i] = this->strides()[d];
  }
  Tensor out = make_view(std::move(sizes), std::move(strides), storage_offset());
  if (!tracks(*this)) return out;
  Shape inverse(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i) inverse[wrap_dim(dims[i], dim(), "permute", shape())] = static_cast<std::int64_t>(i);
  return autograd::record("permute", out, {*this}, [inverse](const Tensor& g, const std::vector<bool>&) {
    return std::vector<Tensor>{g.permute(inverse)};
  });
}

Tensor Tensor::slice(std::int64_t d, std::int64_t start, std::int64_t end, std::int64_t step) const {
  const std::int64_t dd = wrap_dim(d, dim(), "slice", shape());
  if (step <= 0) throw IndexError(fmt::format("slice: step must be positive, got {}", step));
  const std::int64_t n = shape()[dd];
  // Python semantics: negative bounds count from the end, and bounds are clamped to [0, n].
  const auto clamp_bound = [n](std::int64_t v) { return std::clamp<std::int64_t>(v < 0 ? v + n : v, 0, n); };
  const std::int64_t s = clamp_bound(start), e = std::max(clamp_bound(end), clamp_bound(start));
  Shape sizes = shape(), strides = this->strides();
  sizes[dd] = e > s ? 1 + (e - s - 1) / step : 0;  // ceil((e - s) / step) without overflow
  strides[dd] *= step;
  Tensor out = make_view(std::move(sizes), std::move(strides), storage_offset() + s * this->strides()[dd]);
  if (!tracks(*this)) return out;
  const Shape input_shape = shape();
  const DType input_dtype = dtype();
  return autograd::record("slice", out, {*this}, [=](const Tensor& g, const std::vector<bool>&) {
    Tensor grad = zeros(input_shape, {input_dtype, g.device()});
    grad.slice(dd, s, e, step).copy_(g);
    return std::vector<Tensor>{grad};
  });
}

Tensor Tensor::expand(const Shape& target) const {
  check_shape(target, "expand");
  const std::int64_t nd = static_cast<std::int64_t>(target.size());
  if (nd < dim()) {
    throw ShapeError(fmt::format("expand: cannot expand shape {} to {} with fewer dimensions", shape_str(shape()),
                                 shape_str(target)));
  }
  Shape strides(target.size(), 0);
  for (std::int64_t i = 0; i < nd; ++i) {
    const std::int64_t src = i - (nd - dim());  // dimensions align from the right
    if (src < 0) continue;
    if (shape()[src] == target[i]) {
      strides[i] = this->strides()[src];
    } else if (shape()[src] != 1) {
      throw ShapeError(fmt::format("expand: cannot expand shape {} to {}: dimension {} has size {}, not 1 or {}",
                                   shape_str(shape()), shape_str(target), src, shape()[src], target[i]));
    }
  }
  Tensor out = make_view(target, std::move(strides), storage_offset());
  if (!tracks(*this)) return out;
  const Shape input_shape = shape();
  return autograd::record("expand", out, {*this}, [input_shape](const Tensor& g, const std::vector<bool>&) {
    return std::vector<Tensor>{sum_to(g, input_shape)};
  });
}

Tensor Tensor::view_result(std::string_view op, const Tensor& out) const {
  if (!tracks(*this)) return out;
  const Shape input_shape = shape();
  return autograd::record(op, out, {*this}, [input_shape](const Tensor& g, const std::vector<bool>&) {
    return std::vector<Tensor>{g.reshape(input_shape)};
  });
}

// ---- element access ----

std::int64_t Tensor::element_offset(std::initializer_list<std::int64_t> index, const char* op) const {
  if (static_cast<std::int64_t>(index.size()) != dim()) {
    throw IndexError(fmt::format("{}: index [{}] has {} components but the tensor of shape {} has {} dimensions", op,
                                 fmt::join(index, ", "), index.size(), shape_str(shape()), dim()));
  }
  std::int64_t off = storage_offset();
  std::size_t d = 0;
  for (std::int64_t i : index) {
    const std::int64_t n = shape()[d];
    if (i < -n || i >= n) {
      throw IndexError(fmt::format("{}: index {} is out of range for dimension {} of size {} (tensor shape {})", op, i, d,
                                   n, shape_str(shape())));
    }
    off += (i < 0 ? i + n : i) * strides()[d];
    ++d;
  }
  return off;
}

namespace {
// Reads or writes one element at an element offset of a storage, on any device.
double read_element(const Storage& storage, DType dtype, std::int64_t offset) {
  const std::size_t size = dtype_size(dtype);
  alignas(8) unsigned char bytes[8] = {};
  storage.backend().copy_to_host(bytes, static_cast<const char*>(storage.read_data()) + offset * size, size);
  return visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T value;
    std::memcpy(&value, bytes, sizeof(T));
    return convert<double>(value);
  });
}

void write_element(Storage& storage, DType dtype, std::int64_t offset, double value) {
  const std::size_t size = dtype_size(dtype);
  alignas(8) unsigned char bytes[8] = {};
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T v = convert<T>(value);
    std::memcpy(bytes, &v, sizeof(T));
  });
  storage.backend().copy_from_host(static_cast<char*>(storage.data()) + offset * size, bytes, size);
}
}  // namespace

double Tensor::item() const {
  if (numel() != 1) {
    throw ShapeError(fmt::format("item: the tensor has {} elements (shape {}); item() needs exactly one", numel(),
                                 shape_str(shape())));
  }
  return read_element(*impl().storage, dtype(), storage_offset());
}

double Tensor::at(std::initializer_list<std::int64_t> index) const {
  return read_element(*impl().storage, dtype(), element_offset(index, "at"));
}

void Tensor::set(std::initializer_list<std::int64_t> index, double value) {
  check_in_place(*this, "set");
  write_element(*impl().storage, dtype(), element_offset(index, "set"), value);
}

std::vector<double> Tensor::values() const {
  const Tensor host = contiguous().to(Device::cpu());
  std::vector<double> out(static_cast<std::size_t>(numel()));
  visit_dtype(dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(host.data());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = convert<double>(p[i]);
  });
  return out;
}

// ---- creation ----

Tensor full(const Shape& shape, double value, TensorOptions options) {
  Tensor t = Tensor::empty(shape, options);
  t.fill_(value);
  return t;
}

Tensor zeros(const Shape& shape, TensorOptions options) { return full(shape, 0.0, options); }
Tensor ones(const Shape& shape, TensorOptions options) { return full(shape, 1.0, options); }

Tensor arange(double end, TensorOptions options) { return arange(0.0, end, 1.0, options); }

Tensor arange(double start, double end, double step, TensorOptions options) {
  if (step == 0 || !std::isfinite(start) || !std::isfinite(end) || !std::isfinite(step)) {
    throw Error(fmt::format("arange: start, end and step must be finite and step non-zero, got start={} end={} step={}",
                            start, end, step));
  }
  if ((step > 0 && end < start) || (step < 0 && end > start)) {
    throw Error(fmt::format("arange: step {} moves away from end {} (start {})", step, end, start));
  }
  const auto n = static_cast<std::int64_t>(std::ceil((end - start) / step));
  Tensor t = Tensor::empty({n}, options);
  run_kernel("arange", Op::arange, t, {}, {start, step});
  return t;
}

Tensor from_values(const std::vector<double>& values, const Shape& shape, TensorOptions options) {
  check_shape(shape, "from_values");
  if (static_cast<std::int64_t>(values.size()) != shape_numel(shape)) {
    throw ShapeError(fmt::format("from_values: {} values given for shape {}, which holds {}", values.size(),
                                 shape_str(shape), shape_numel(shape)));
  }
  Tensor host = Tensor::empty(shape, {options.dtype, Device::cpu()});
  visit_dtype(host.dtype(), [&](auto tag) {  // f32 under WidenToF32 where f16/bf16 was asked
    using T = decltype(tag);
    T* p = static_cast<T*>(host.data());
    for (std::size_t i = 0; i < values.size(); ++i) p[i] = convert<T>(values[i]);
  });
  return host.to(options.device);
}

}  // namespace ampscope
