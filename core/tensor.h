// core/tensor.h: the n-dimensional array of ampscope's runtime.
//
// A Tensor is a cheap handle: copies share the same data (reference-counted Storage). Views (reshape,
// transpose, permute, slice, expand) share storage and differ in sizes, strides and offset; `to` and
// `contiguous` copy only when they must. Elements are stored in the tensor's dtype; f16 and bf16 are
// rounded exactly as on the GPU (core/float16.h).
//
//   Tensor x = arange(6, {.dtype = DType::f16}).reshape({2, 3});  // [[0, 1, 2], [3, 4, 5]] in f16
//   Tensor t = x.transpose(0, 1);                                  // a 3x2 view of the same data
//   double v = t.at({2, 1});                                       // 5
//   Tensor y = x.to(DType::f32).to(Device::cuda());                // copies (throws if no GPU)
//   fmt::print("{}\n", x);                                         // needs core/format.h
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor_view.h"

namespace ampscope {

using Shape = std::vector<std::int64_t>;

// "[2, 3]"
std::string shape_str(const Shape& shape);

struct TensorOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
};

// Bytes on one device, freed through the backend that allocated them when the last tensor using them
// goes away.
//
// Each storage has a serial number, never reused in the process (an address is: freed bytes come back),
// and a version that changes whenever the bytes may have been written: every route to a writable pointer
// (data(), and so Tensor::data(), data_as(), kernel_view(), copy_, fill_, set, every kernel's output and
// input) increments it before handing the pointer out. So (serial, version) equal at two moments means no
// pointer was handed out in between that could have written the bytes; the probe's statistics cache
// (probes/probe.h) relies on it. read_data() is the one pointer that does not count: it is const, for code
// that only reads (the probe's statistics pass). The increment is atomic: kernels may ask for pointers
// from several threads.
// Where a storage's bytes came from when it was made as a copy of a contiguous tensor of the same dtype
// (Tensor::clone): that tensor's storage serial and version at the copy, its offset and element count.
struct StorageCopy {
  std::uint64_t serial = 0;
  std::uint64_t version = 0;
  std::int64_t offset = 0;  // in elements
  std::int64_t numel = 0;
  DType dtype = DType::f32;
};

class Storage {
 public:
  Storage(Backend& backend, std::size_t nbytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // A pointer the caller may write through: counts as a write (the version changes).
  void* data() const {
    version_.fetch_add(1, std::memory_order_relaxed);
    return data_;
  }
  // A pointer for reading only: the version stays.
  const void* read_data() const { return data_; }
  std::uint64_t serial() const { return serial_; }
  std::uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  // Records that the bytes, as they are now, are a copy of `from` (called by clone, right after the copy).
  void note_copy(const StorageCopy& from) {
    copy_ = from;
    copy_version_ = version();
    has_copy_ = true;
  }
  // The copy noted, while the bytes are still unwritten since; false otherwise.
  bool copy_source(StorageCopy& from) const {
    if (!has_copy_ || version() != copy_version_) return false;
    from = copy_;
    return true;
  }
  std::size_t nbytes() const { return nbytes_; }
  Backend& backend() const { return *backend_; }
  Device device() const { return backend_->device(); }

 private:
  Backend* backend_;
  std::size_t nbytes_;
  void* data_;
  std::uint64_t serial_;
  mutable std::atomic<std::uint64_t> version_{0};
  StorageCopy copy_{};
  std::uint64_t copy_version_ = 0;
  bool has_copy_ = false;
};

namespace autograd {
struct Meta;
class Node;
}  // namespace autograd

namespace detail {
struct TensorImpl {
  std::shared_ptr<Storage> storage;
  std::int64_t offset = 0;  // in elements
  Shape sizes;
  Shape strides;  // in elements
  DType dtype = DType::f32;
  std::shared_ptr<autograd::Meta> autograd;  // null for tensors that never took part in autograd
  // Which reported op wrote this tensor object last (core/probe_hook.h, Producer): set by the op
  // dispatcher and the autograd engine while a probe hook is installed.
  std::int64_t producer_step = -1;
  std::int64_t producer_seq = -1;  // -1: none
};
}  // namespace detail

namespace detail {
struct TensorAccess;  // core's internal access to a Tensor's impl (autograd)
}  // namespace detail

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor; most calls on it throw

  // Uninitialised contiguous tensor.
  static Tensor empty(const Shape& shape, TensorOptions options = {});

  bool defined() const { return impl_ != nullptr; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  const Shape& shape() const { return impl().sizes; }
  const Shape& strides() const { return impl().strides; }
  std::int64_t dim() const { return static_cast<std::int64_t>(impl().sizes.size()); }
  std::int64_t size(std::int64_t d) const;  // negative d counts from the end
  std::int64_t numel() const;
  std::int64_t storage_offset() const { return impl().offset; }
  bool is_contiguous() const;
  bool shares_storage_with(const Tensor& other) const;

  // Pointer to the first element. Host pointer for CPU tensors, device pointer for CUDA tensors. Counts as
  // a write of the storage (its version changes; see Storage), as do data_as() and kernel_view().
  void* data() const;
  // The same pointer, for reading only: the storage's version stays. Only code that never writes through
  // it may use it (the probe's statistics).
  const void* read_data() const;
  // The storage's serial number (never reused) and its version (changes whenever the storage may have
  // been written, through any tensor sharing it): equal pairs mean the same, unwritten bytes.
  std::uint64_t storage_serial() const;
  std::uint64_t storage_version() const;
  // For a tensor that is the whole of a storage made by clone() of a contiguous tensor of the same dtype,
  // and not written since: that tensor as it was at the copy (true); false otherwise. Its values are the
  // same as those (clone copies them exactly), so statistics of one are statistics of the other.
  bool copied_from(StorageCopy& from) const;
  // Typed host pointer; throws unless the tensor is on the CPU and T matches its dtype.
  template <class T>
  T* data_as() const;

  // What a kernel sees. Throws ShapeError beyond kMaxDims dimensions.
  TensorView kernel_view() const;

  // ---- copies and conversions ----
  Tensor contiguous() const;               // self when already contiguous
  Tensor clone() const;                    // always a new contiguous tensor
  Tensor to(DType dtype) const;            // self when the dtype matches; IEEE rounding otherwise
  Tensor to(Device device) const;          // self when already there
  Tensor& copy_(const Tensor& src);        // same shape; casts and moves across devices as needed
  Tensor& fill_(double value);

  // ---- views (share storage) ----
  Tensor view(const Shape& shape) const;     // throws if the strides cannot express it
  Tensor reshape(const Shape& shape) const;  // a view when possible, else a copy; one -1 is inferred
  Tensor transpose(std::int64_t d0, std::int64_t d1) const;
  Tensor permute(const Shape& dims) const;
  Tensor slice(std::int64_t dim, std::int64_t start, std::int64_t end, std::int64_t step = 1) const;
  Tensor expand(const Shape& shape) const;   // broadcast view: size-1 dimensions get stride 0

  // ---- element access (for tests and small reads; one device copy per call on CUDA) ----
  double item() const;                                    // the single element, widened to double
  double at(std::initializer_list<std::int64_t> index) const;
  void set(std::initializer_list<std::int64_t> index, double value);  // rounds to the dtype
  std::vector<double> values() const;                     // all elements, row-major, widened to double

  std::string to_string() const;  // PyTorch-like, with dtype and device

  // ---- autograd (core/autograd.h has the engine) ----
  // A leaf is a tensor no recorded op produced; only floating leaves can require grad. Ops on tensors
  // that require grad record a node while grad mode is on (see NoGradGuard).
  bool requires_grad() const;
  Tensor& requires_grad_(bool on = true);  // leaves only; throws on non-floating dtypes
  bool is_leaf() const;
  std::shared_ptr<autograd::Node> grad_fn() const;  // null for leaves
  // The accumulated gradient of a leaf (undefined until a backward() reaches it).
  Tensor grad() const;
  void set_grad(const Tensor& grad);  // undefined clears it
  // A name shown in autograd and optimizer errors; modules set it to the parameter's path.
  const std::string& name() const;
  Tensor& set_name(std::string name);
  // The same data, cut from the graph: a new leaf that does not require grad.
  Tensor detach() const;
  // Back-propagates from this tensor. A non-scalar needs `gradient` (same shape). The graph is freed
  // afterwards unless retain_graph is true; a second backward() through a freed graph throws.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  // Identity of the underlying tensor object (the same for copies of this handle, not for views).
  const void* id() const { return impl_.get(); }

  // ---- provenance (for probes; core/probe_hook.h) ----
  // The reported op that wrote this tensor object last, as (step, seq), with seq one of probe::Producer's
  // values; (-1, -1) when no reported op did (data, constants, parameters). Views, clones, detached
  // tensors and autocast's casts inherit their source's.
  std::pair<std::int64_t, std::int64_t> producer() const;
  void set_producer(std::int64_t step, std::int64_t seq) const;

 private:
  friend struct detail::TensorAccess;
  explicit Tensor(std::shared_ptr<detail::TensorImpl> impl) : impl_(std::move(impl)) {}
  const detail::TensorImpl& impl() const;
  Tensor make_view(Shape sizes, Shape strides, std::int64_t offset) const;
  Tensor view_result(std::string_view op, const Tensor& out) const;  // records a reshape-like view
  std::int64_t element_offset(std::initializer_list<std::int64_t> index, const char* op) const;

  std::shared_ptr<detail::TensorImpl> impl_;
};

// ---- creation ----
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor ones(const Shape& shape, TensorOptions options = {});
Tensor full(const Shape& shape, double value, TensorOptions options = {});
Tensor arange(double end, TensorOptions options = {});
Tensor arange(double start, double end, double step, TensorOptions options = {});
// Values given row-major, rounded to the dtype (f64 -> f32 -> f16/bf16, as PyTorch does).
Tensor from_values(const std::vector<double>& values, const Shape& shape, TensorOptions options = {});

// ---- the low-level kernel calls every op goes through ----
// Checks that all tensors are on out's device (DeviceError naming `op` otherwise), broadcasts inputs to
// out's shape, and runs the backend's kernel for (kernel, out.dtype()).
void run_kernel(std::string_view op, Op kernel, const Tensor& out, std::initializer_list<Tensor> inputs,
                std::initializer_list<double> scalars = {}, std::uint64_t seed = 0, std::uint64_t offset = 0);

// The general form, for kernels whose inputs are not broadcast (rows, matrix products, windows): every
// output and input is passed as it is (an undefined input is an absent optional one), all must be on
// the first output's device, and the kernel is chosen by (kernel, outputs[0].dtype()).
void run_kernel_general(std::string_view op, Op kernel, std::initializer_list<Tensor> outputs,
                        std::initializer_list<Tensor> inputs, std::initializer_list<double> scalars = {},
                        std::uint64_t seed = 0, std::uint64_t offset = 0);

// ---- template definitions ----
template <class T>
T* Tensor::data_as() const {
  if (!device().is_cpu() || dtype_of<T>::value != dtype()) {
    throw DTypeError("data_as: the tensor is " + std::string(dtype_name(dtype())) + " on " + device().str() +
                     ", but a host pointer to " + std::string(dtype_name(dtype_of<T>::value)) + " was asked for");
  }
  return static_cast<T*>(data());
}

}  // namespace ampscope
