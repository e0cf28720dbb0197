// The autograd engine: recording nodes, and running backward in reverse topological order.
#include "core/autograd.h"

#include <algorithm>
#include <atomic>
#include <queue>
#include <unordered_map>

#include <fmt/format.h>

#include "core/autocast.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/probe_hook.h"

namespace ampscope {

namespace detail {
// core's access to a Tensor's private impl, for the autograd metadata.
struct TensorAccess {
  static detail::TensorImpl& impl(const Tensor& t) { return const_cast<detail::TensorImpl&>(t.impl()); }
  static std::shared_ptr<detail::TensorImpl> shared(const Tensor& t) { return t.impl_; }
  static Tensor wrap(std::shared_ptr<detail::TensorImpl> impl) { return Tensor(std::move(impl)); }
};
}  // namespace detail

namespace {
thread_local bool g_grad_enabled = true;
thread_local std::optional<DType> g_widen_to;  // WidenTo
thread_local std::vector<std::string> g_scopes;
const std::string kNoScope;
std::atomic<std::uint64_t> g_sequence{0};

autograd::Meta& meta_of(const Tensor& t) {
  detail::TensorImpl& impl = detail::TensorAccess::impl(t);
  if (!impl.autograd) impl.autograd = std::make_shared<autograd::Meta>();
  return *impl.autograd;
}
const autograd::Meta* meta_if(const Tensor& t) {
  if (!t.defined()) return nullptr;
  return detail::TensorAccess::impl(t).autograd.get();
}

std::string describe(const Tensor& t) {
  const autograd::Meta* m = meta_if(t);
  std::string s = fmt::format("tensor of shape {} ({})", shape_str(t.shape()), dtype_name(t.dtype()));
  if (m != nullptr && !m->name.empty()) s = fmt::format("'{}' ({})", m->name, s);
  return s;
}

std::string where(const autograd::Node& node) {
  return node.scope().empty() ? fmt::format("'{}'", node.op()) : fmt::format("'{}' in '{}'", node.op(), node.scope());
}

// Accumulates into a leaf's .grad. Holds the leaf alive; the leaf refers back to it only weakly.
class AccumulateGrad final : public autograd::Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<detail::TensorImpl> leaf) : Node("AccumulateGrad", ""), leaf_(std::move(leaf)) {
    output_shape_ = leaf_->sizes;
    output_dtype_ = leaf_->dtype;
  }

  std::vector<Tensor> apply(const Tensor& grad, const std::vector<bool>&) override {
    Tensor leaf = detail::TensorAccess::wrap(leaf_);
    autograd::Meta& m = meta_of(leaf);
    NoGradGuard no_grad;
    if (!m.grad.defined()) {
      m.grad = grad.clone();  // a fresh buffer, never an alias of a tensor some other node still holds
    } else {
      // In place, as PyTorch does: a handle to .grad taken earlier (by a scaler, a probe) sees the sum.
      m.grad.copy_(add(m.grad, grad));
    }
    return {};
  }
  void release() override {}  // nothing saved; a leaf's accumulator serves every backward

 private:
  std::shared_ptr<detail::TensorImpl> leaf_;
};

std::shared_ptr<autograd::Node> edge_for(const Tensor& t) {
  if (!t.defined()) return nullptr;
  detail::TensorImpl& impl = detail::TensorAccess::impl(t);
  if (!impl.autograd) return nullptr;
  autograd::Meta& m = *impl.autograd;
  if (m.grad_fn) return m.grad_fn;
  if (!m.requires_grad) return nullptr;
  if (auto acc = m.grad_accumulator.lock()) return acc;
  auto acc = std::make_shared<AccumulateGrad>(detail::TensorAccess::shared(t));
  m.grad_accumulator = acc;
  return acc;
}
}  // namespace

// ---- grad mode and scopes ----

bool grad_enabled() { return g_grad_enabled; }
NoGradGuard::NoGradGuard() : previous_(g_grad_enabled) { g_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { g_grad_enabled = previous_; }

ScopeGuard::ScopeGuard(const std::string& name) { g_scopes.push_back(name); }
ScopeGuard::~ScopeGuard() { g_scopes.pop_back(); }
const std::string& current_scope() { return g_scopes.empty() ? kNoScope : g_scopes.back(); }

// ---- Tensor's autograd members ----

bool Tensor::requires_grad() const {
  const autograd::Meta* m = meta_if(*this);
  return m != nullptr && (m->requires_grad || m->grad_fn != nullptr);
}

Tensor& Tensor::requires_grad_(bool on) {
  autograd::Meta& m = meta_of(*this);
  if (m.grad_fn && on) return *this;  // a recorded op's output already requires grad
  if (m.grad_fn) {
    throw Error(fmt::format("requires_grad_: {} is the output of '{}', not a leaf; only leaves can change "
                            "requires_grad\nhint: use detach() to make a leaf from it",
                            describe(*this), m.grad_fn->op()));
  }
  if (on && !is_floating(dtype())) {
    throw DTypeError(fmt::format("requires_grad_: only floating tensors can require grad, got {}", describe(*this)));
  }
  m.requires_grad = on;
  return *this;
}

bool Tensor::is_leaf() const {
  const autograd::Meta* m = meta_if(*this);
  return m == nullptr || m->grad_fn == nullptr;
}

std::shared_ptr<autograd::Node> Tensor::grad_fn() const {
  const autograd::Meta* m = meta_if(*this);
  return m == nullptr ? nullptr : m->grad_fn;
}

Tensor Tensor::grad() const {
  const autograd::Meta* m = meta_if(*this);
  return m == nullptr ? Tensor() : m->grad;
}

void Tensor::set_grad(const Tensor& grad) {
  if (grad.defined() && (grad.shape() != shape() || grad.device() != device() || grad.dtype() != dtype())) {
    throw ShapeError(fmt::format("set_grad: gradient of shape {} ({}) on {} given for {} on {}; a gradient must have "
                                 "the tensor's shape, dtype and device",
                                 shape_str(grad.shape()), dtype_name(grad.dtype()), grad.device().str(),
                                 describe(*this), device().str()));
  }
  meta_of(*this).grad = grad;
}

const std::string& Tensor::name() const {
  const autograd::Meta* m = meta_if(*this);
  return m == nullptr ? kNoScope : m->name;
}

Tensor& Tensor::set_name(std::string name) {
  meta_of(*this).name = std::move(name);
  return *this;
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<detail::TensorImpl>();
  const detail::TensorImpl& src = this->impl();
  impl->storage = src.storage;
  impl->offset = src.offset;
  impl->sizes = src.sizes;
  impl->strides = src.strides;
  impl->dtype = src.dtype;
  impl->producer_step = src.producer_step;  // the same values, cut from the graph
  impl->producer_seq = src.producer_seq;
  return Tensor(std::move(impl));
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  if (!requires_grad()) {
    throw Error(fmt::format("backward: {} does not require grad and has no grad_fn\nhint: call requires_grad_() on "
                            "the parameters before the forward pass, and do not run it inside a NoGradGuard",
                            describe(*this)));
  }
  Tensor grad = gradient;
  if (!grad.defined()) {
    if (numel() != 1) {
      throw Error(fmt::format("backward: grad can be implicitly created only for scalar outputs, but {} has {} "
                              "elements\nhint: pass a gradient of shape {}, or reduce first (sum, mean)",
                              describe(*this), numel(), shape_str(shape())));
    }
    grad = ones(shape(), {dtype(), device()});
  } else if (grad.shape() != shape()) {
    throw ShapeError(fmt::format("backward: gradient of shape {} given for {}", shape_str(grad.shape()),
                                 describe(*this)));
  }
  autograd::run_backward(*this, grad.to(dtype()), retain_graph);
}

namespace autograd {

std::vector<Tensor> Node::apply(const Tensor& grad_output, const std::vector<bool>& needs) {
  if (released_ || !backward_) {
    throw Error(fmt::format("backward: trying to backward through the graph a second time: the saved tensors of "
                            "{} were freed by an earlier backward()\nhint: pass retain_graph=true to the first "
                            "backward() if you need to call it twice",
                            where(*this)));
  }
  return backward_(grad_output, needs);
}

std::vector<Tensor> Node::apply_in_f32(const Tensor& grad_output, const std::vector<bool>& needs) {
  return apply_widened(grad_output, needs, DType::f32);
}

std::vector<Tensor> Node::apply_widened(const Tensor& grad_output, const std::vector<bool>& needs, DType to) {
  const WidenTo widen(to);
  return apply(grad_output.to(to), needs);
}

WidenTo::WidenTo(DType to) : previous_(g_widen_to) {
  if (to != DType::f32 && to != DType::f64) {
    throw Error(fmt::format("WidenTo: {} is not a dtype to widen to; use f32 or f64", dtype_name(to)));
  }
  g_widen_to = to;
}
WidenTo::~WidenTo() { g_widen_to = previous_; }
bool widening_to_f32() { return g_widen_to == DType::f32; }
std::optional<DType> widening_target() { return g_widen_to; }
DType widened_dtype(DType dtype) {
  if (!g_widen_to) return dtype;
  if (*g_widen_to == DType::f32) return dtype == DType::f16 || dtype == DType::bf16 ? DType::f32 : dtype;
  return dtype == DType::f16 || dtype == DType::bf16 || dtype == DType::f32 ? DType::f64 : dtype;
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return false;
  return std::any_of(inputs.begin(), inputs.end(), [](const Tensor& t) { return t.defined() && t.requires_grad(); });
}

Tensor record(std::string_view op, const Tensor& out, const std::vector<Tensor>& inputs, BackwardFn backward) {
  if (!any_requires_grad(inputs)) return out;
  auto node = std::make_shared<Node>(std::string(op), current_scope());
  node->sequence_ = g_sequence.fetch_add(1);
  node->output_shape_ = out.shape();
  node->output_dtype_ = out.dtype();
  node->backward_ = std::move(backward);
  for (const Tensor& in : inputs) {
    node->next_.push_back(edge_for(in));
    node->inputs_.push_back(in.defined() ? Node::InputInfo{in.shape(), in.dtype()} : Node::InputInfo{});
  }
  // The output is a new tensor object that now belongs to the graph. Outputs that alias an input's impl
  // (an op returning its input unchanged) get a fresh impl first so the input's metadata is untouched.
  Tensor result = out;
  for (const Tensor& in : inputs) {
    if (in.defined() && in.id() == out.id()) {
      result = out.detach();
      break;
    }
  }
  Meta& m = meta_of(result);
  m.grad_fn = std::move(node);
  m.requires_grad = true;
  return result;
}

namespace {
// Tells the probe hook what one node computed: the gradient it received and those it produced.
// The gradients it produced are stamped with its seq afterwards (provenance, core/probe_hook.h).
void report_backward_node(Node& node, const Tensor& grad_output, const std::vector<bool>& needs,
                          const std::vector<Tensor>& grads) {
  probe::Hook* h = probe::hook();
  if (h == nullptr || !grad_output.defined() || node.op() == "AccumulateGrad") return;
  const std::int64_t step = probe::current_step();
  auto stamp = [&](std::int64_t seq) {
    for (const Tensor& g : grads) {
      if (g.defined()) g.set_producer(step, seq);
    }
  };
  if (!h->wants_op(node.op(), node.scope())) {
    stamp(probe::Producer::unrecorded);
    return;
  }
  const std::vector<Tensor> inputs{grad_output};
  Tensor first;
  for (const Tensor& g : grads) {
    if (g.defined()) {
      first = g;
      break;
    }
  }
  const probe::AutocastInfo no_autocast;
  const std::int64_t seq = probe::next_seq();
  // The node's backward again in f32 (or f64), for the twin (probe::OpEvent::recompute_backward).
  const std::function<std::vector<Tensor>(const Tensor&, DType)> again = [&node, &needs](const Tensor& g, DType to) {
    return node.apply_widened(g, needs, to);
  };
  probe::OpEvent event{node.op(), node.scope(), ampscope::detail::next_op_index(), step,
                       seq, probe::Phase::backward, no_autocast, inputs, first, grads};
  event.recompute_backward = &again;
  h->on_backward_op(event);
  stamp(seq);
}
}  // namespace

void run_backward(const Tensor& root, const Tensor& grad, bool retain_graph) {
  const std::shared_ptr<Node> root_node = edge_for(root);
  if (!root_node) return;

  // Dependencies: how many edges point at each node from nodes reachable from the root.
  std::unordered_map<Node*, int> dependencies;
  std::vector<Node*> stack{root_node.get()};
  std::unordered_map<Node*, bool> seen{{root_node.get(), true}};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const auto& next : n->next()) {
      if (!next) continue;
      ++dependencies[next.get()];
      if (!seen[next.get()]) {
        seen[next.get()] = true;
        stack.push_back(next.get());
      }
    }
  }

  // Ready nodes run newest first (highest sequence number), as PyTorch's engine does on one device.
  auto newer = [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) {
    return a->sequence() < b->sequence();
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, decltype(newer)> ready(newer);
  std::unordered_map<Node*, Tensor> pending;  // summed incoming gradient per node
  pending[root_node.get()] = grad;
  ready.push(root_node);

  NoGradGuard no_grad;            // backward computations are not themselves recorded
  RuntimeInternalGuard internal;  // nor autocast (its policy is not applied to backward), nor probed
  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    Tensor g = std::move(pending[node.get()]);
    pending.erase(node.get());
    std::vector<bool> needs;
    for (const auto& next : node->next()) needs.push_back(next != nullptr);
    // No gradient reached this node (every path into it carried none): nothing flows on from it.
    std::vector<Tensor> grads = g.defined() ? node->apply(g, needs) : std::vector<Tensor>{};
    if (!grads.empty() && grads.size() != node->next().size()) {
      throw Error(fmt::format("backward of {}: returned {} gradients for {} inputs; this is a bug in the op's backward",
                              where(*node), grads.size(), node->next().size()));
    }
    report_backward_node(*node, g, needs, grads);
    // Saved tensors are freed as soon as the node has run, so peak memory does not hold every
    // activation until the end of backward.
    if (!retain_graph) node->release();
    for (std::size_t i = 0; i < node->next().size(); ++i) {
      const std::shared_ptr<Node>& next = node->next()[i];
      if (!next) continue;
      if (i < grads.size() && grads[i].defined()) {
        const Node::InputInfo& info = node->inputs()[i];
        if (grads[i].shape() != info.shape || grads[i].dtype() != info.dtype) {
          throw Error(fmt::format("backward of {}: gradient {} has shape {} ({}), but input {} is {} ({}); this is a "
                                  "bug in the op's backward",
                                  where(*node), i, shape_str(grads[i].shape()), dtype_name(grads[i].dtype()), i,
                                  shape_str(info.shape), dtype_name(info.dtype)));
        }
        Tensor& slot = pending[next.get()];
        if (slot.defined()) {
          slot = add(slot, grads[i]);
          if (probe::hook() != nullptr) slot.set_producer(probe::current_step(), probe::Producer::summed);
        } else {
          slot = grads[i];
        }
      }
      if (--dependencies[next.get()] == 0) ready.push(next);
    }
  }
}

}  // namespace autograd
}  // namespace ampscope
