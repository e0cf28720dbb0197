// core/autograd.h: reverse-mode automatic differentiation for ampscope's ops.
//
// Every differentiable op, when grad mode is on and one of its inputs requires grad, records a Node:
// the op's name, the module it ran in, edges to the nodes of its inputs, and a backward function that
// maps the gradient of its output to gradients of its inputs (same shape and dtype as each input).
// Tensor::backward() walks the graph in reverse topological order, sums the gradients that meet at a
// node, and accumulates leaf gradients into `.grad`. Afterwards the graph's saved tensors are freed
// unless retain_graph was asked for.
//
//   Tensor w = randn({3, 2}, gen).requires_grad_();
//   Tensor loss = sum(relu(matmul(x, w)));
//   loss.backward();                        // w.grad() is now d loss / d w, f32 like w
//   { NoGradGuard guard; w.copy_(sub(w, mul(w.grad(), 0.1))); }  // no graph inside the guard
//
// Saved tensors are kept detached from the graph (no reference cycles); in-place changes to a saved
// tensor are not tracked, so update parameters only between backward() and the next forward pass.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ampscope {

// ---- grad mode ----
bool grad_enabled();  // thread-local, on by default

// Turns recording off for its lifetime (thread-local), restoring the previous mode after.
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// ---- scope names: which module an op ran in ----
// Modules push their hierarchical name while they run, so a recorded node and an error message can say
// "blocks.0.attn.qkv". Thread-local.
class ScopeGuard {
 public:
  explicit ScopeGuard(const std::string& name);
  ~ScopeGuard();
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;
};
const std::string& current_scope();  // "" outside every module

namespace autograd {

// Maps the gradient of a node's output to one gradient per input. `needs[i]` says whether input i
// wants one; an undefined Tensor means "no gradient" (treated as zeros).
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output, const std::vector<bool>& needs)>;

class Node {
 public:
  Node(std::string op, std::string scope) : op_(std::move(op)), scope_(std::move(scope)) {}
  virtual ~Node() = default;

  const std::string& op() const { return op_; }        // "linear", "AccumulateGrad"
  const std::string& scope() const { return scope_; }  // the module it was recorded in
  const std::vector<std::shared_ptr<Node>>& next() const { return next_; }
  std::uint64_t sequence() const { return sequence_; }

  // Shape and dtype of the output the node was recorded for (its incoming gradient must match).
  const Shape& output_shape() const { return output_shape_; }
  DType output_dtype() const { return output_dtype_; }

  virtual std::vector<Tensor> apply(const Tensor& grad_output, const std::vector<bool>& needs);
  // The same backward again, in f32 (the f32 twin's backward, probes/twin.h): apply() on `grad_output` widened
  // to f32, under WidenToF32, so every f16/bf16 tensor its computation reads (the incoming gradient, the saved
  // tensors) is widened exactly and every result it makes is f32. Call it after apply() and before release();
  // it changes nothing the run holds (a backward function has no side effects: see record()).
  std::vector<Tensor> apply_in_f32(const Tensor& grad_output, const std::vector<bool>& needs);
  // The same in `to` (f32 or f64) under WidenTo(to): apply_in_f32 is apply_widened(..., DType::f32).
  std::vector<Tensor> apply_widened(const Tensor& grad_output, const std::vector<bool>& needs, DType to);
  virtual void release() { backward_ = nullptr; released_ = true; }
  bool released() const { return released_; }

  // Shapes and dtypes of the inputs, checked against what backward returns.
  struct InputInfo {
    Shape shape;
    DType dtype = DType::f32;
  };
  const std::vector<InputInfo>& inputs() const { return inputs_; }

 protected:
  friend Tensor record(std::string_view, const Tensor&, const std::vector<Tensor>&, BackwardFn);
  friend class Engine;
  std::string op_;
  std::string scope_;
  std::vector<std::shared_ptr<Node>> next_;
  std::vector<InputInfo> inputs_;
  Shape output_shape_;
  DType output_dtype_ = DType::f32;
  BackwardFn backward_;
  bool released_ = false;
  std::uint64_t sequence_ = 0;
};

// What a tensor carries for autograd.
struct Meta {
  bool requires_grad = false;
  Tensor grad;                                // leaves: accumulated gradient
  std::shared_ptr<Node> grad_fn;              // non-leaves: the node that produced the tensor
  std::weak_ptr<Node> grad_accumulator;       // leaves: the AccumulateGrad node, shared by all uses
  std::string name;                           // parameter path, for messages
};

// Records `op` as the producer of `out` when grad mode is on and any input requires grad; returns
// `out` (which then requires grad). Inputs may be undefined (absent optional arguments). Saved tensors
// belong in the lambda, detached (Tensor::detach()) so that the graph holds no cycles. The backward function
// must have no side effects beyond the gradients it returns, and must take its dtypes from its tensors (never
// read an f16/bf16 buffer through a raw pointer): the f32 twin (`--twin`) calls it a second time, in f32
// (Node::apply_in_f32).
Tensor record(std::string_view op, const Tensor& out, const std::vector<Tensor>& inputs, BackwardFn backward);

// True when an op on these inputs would be recorded.
bool any_requires_grad(const std::vector<Tensor>& inputs);

// ---- the f32 mode of a backward's second run (Node::apply_in_f32) ----
// While a WidenToF32 is alive (thread-local), core computes in f32 whatever would be f16 or bf16: a tensor made
// as f16/bf16 (Tensor::empty, and so every op's result) is made as f32, a cast to f16/bf16 (Tensor::to) is a
// cast to f32, and every f16/bf16 input of a kernel other than a copy is widened to f32 first (exactly). A
// backward function run under it is therefore its own f32 twin: the same code, the same kernels and the same
// order of operations, on its inputs widened, with nothing rounded to f16/bf16. Only the twin uses it: around a
// node's backward, and (WidenTo(f64)) around an f32 op's forward computed again in f64; nothing else may run
// under it (an op's result would not have the dtype asked).
//
// WidenTo(DType::f64) is the same one dtype wider for the f64 twin of f32 nodes (`--twin-f64`): f16, bf16 and f32
// tensors made, cast to and read by kernels are f64. The innermost widening alive on the thread decides.
class WidenTo {
 public:
  explicit WidenTo(DType to);  // f32 or f64; throws Error for another dtype
  ~WidenTo();
  WidenTo(const WidenTo&) = delete;
  WidenTo& operator=(const WidenTo&) = delete;

 private:
  std::optional<DType> previous_;
};
class WidenToF32 : public WidenTo {
 public:
  WidenToF32() : WidenTo(DType::f32) {}
};
bool widening_to_f32();                  // the innermost widening alive is to f32
std::optional<DType> widening_target();  // the innermost widening's dtype, if one is alive
// `dtype`, or the widening's dtype where one is alive and `dtype` is a floating dtype with fewer significand bits.
DType widened_dtype(DType dtype);

// Runs backward from `root` with `grad` (same shape and dtype as root).
void run_backward(const Tensor& root, const Tensor& grad, bool retain_graph);

}  // namespace autograd
}  // namespace ampscope
