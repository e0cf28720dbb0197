// FP8 Linear GEMMs on the CPU (core/fp8_linear.h).
#include "core/fp8_linear.h"

#include <fnmatch.h>

#include <array>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "core/cpu_gemm.h"
#include "core/error.h"
#include "core/fp8_linear_device.h"
#include "core/probe_hook.h"

namespace ampscope {
namespace {

thread_local std::shared_ptr<Fp8Context> t_active;

// The 256 decoded values of a format: decoding is exact, so a table is the formula.
const std::array<float, 256>& decode_table(Fp8Format format) {
  static const auto make = [](Fp8Format f) {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[static_cast<std::size_t>(c)] = fp8_to_float(static_cast<std::uint8_t>(c), f);
    return t;
  };
  static const std::array<float, 256> e4m3 = make(Fp8Format::e4m3);
  static const std::array<float, 256> e5m2 = make(Fp8Format::e5m2);
  return format == Fp8Format::e4m3 ? e4m3 : e5m2;
}

// op(X) decoded into a row-major [R, C] float matrix.
std::vector<float> decoded(const Fp8Quantized& x, bool transpose) {
  const std::array<float, 256>& table = decode_table(x.format);
  std::vector<float> out(x.codes.size());
  if (!transpose) {
    for (std::size_t i = 0; i < x.codes.size(); ++i) out[i] = table[x.codes[i]];
    return out;
  }
  for (std::int64_t r = 0; r < x.rows; ++r)
    for (std::int64_t c = 0; c < x.cols; ++c)
      out[static_cast<std::size_t>(c * x.rows + r)] = table[x.codes[static_cast<std::size_t>(r * x.cols + c)]];
  return out;
}

}  // namespace

std::string_view fp8_operand_name(Fp8Operand operand) {
  switch (operand) {
    case Fp8Operand::input: return "input";
    case Fp8Operand::weight: return "weight";
    case Fp8Operand::grad_output: return "grad_output";
  }
  return "?";
}

Fp8Format fp8_operand_format(Fp8Operand operand, Fp8FormatMix mix) {
  return operand == Fp8Operand::grad_output && mix == Fp8FormatMix::hybrid ? Fp8Format::e5m2 : Fp8Format::e4m3;
}

DelayedScalingState& Fp8LinearState::operand(Fp8Operand o) {
  return o == Fp8Operand::input ? input : o == Fp8Operand::weight ? weight : grad_output;
}
const DelayedScalingState& Fp8LinearState::operand(Fp8Operand o) const {
  return o == Fp8Operand::input ? input : o == Fp8Operand::weight ? weight : grad_output;
}

Fp8Context::Fp8Context(Fp8Options options) : options_(std::move(options)) {
  (void)make_delayed_scaling_state(options_.delayed);  // validates the history length and margin now
}

bool Fp8Context::covers(std::string_view module) const {
  const std::string path(module);
  for (const std::string& glob : options_.keep_bf16)
    if (::fnmatch(glob.c_str(), path.c_str(), 0) == 0) return false;
  return true;
}

Fp8LinearState& Fp8Context::state(const std::string& module) {
  auto it = states_.find(module);
  if (it == states_.end()) {
    const DelayedScalingState fresh = make_delayed_scaling_state(options_.delayed);
    it = states_.emplace(module, Fp8LinearState{fresh, fresh, fresh}).first;
  }
  return it->second;
}

void Fp8Context::end_step() {
  if (options_.recipe != Fp8Recipe::delayed) return;
  for (auto& [module, s] : states_) {
    for (Fp8Operand o : {Fp8Operand::input, Fp8Operand::weight, Fp8Operand::grad_output})
      delayed_scaling_update(s.operand(o), options_.delayed, fp8_operand_format(o, options_.formats));
  }
}

std::uint64_t Fp8Context::take_random_blocks(std::uint64_t n) {
  const std::uint64_t offset = random_offset_;
  random_offset_ += (n + 3) / 4;
  return offset;
}

Fp8Guard::Fp8Guard(std::shared_ptr<Fp8Context> context) : previous_(std::move(t_active)) {
  t_active = std::move(context);
}
Fp8Guard::~Fp8Guard() { t_active = std::move(previous_); }

std::shared_ptr<Fp8Context> active_fp8_context() { return t_active; }

Fp8Quantized fp8_quantize_operand(const Tensor& matrix, Fp8Operand operand, const Fp8Options& options,
                                  Fp8LinearState* state, const std::string& module) {
  if (matrix.dim() != 2) {
    throw ShapeError(fmt::format("FP8 {}: expected a 2-D matrix, got shape {}", fp8_operand_name(operand),
                                 shape_str(matrix.shape())));
  }
  if (!matrix.device().is_cpu()) return fp8_quantize_operand_device(matrix, operand, options, state, module);
  const Tensor f = matrix.to(DType::f32).contiguous();
  const float* v = f.data_as<float>();
  const std::size_t n = static_cast<std::size_t>(f.numel());
  // max |x| folded with fmaxf, as TE's cast kernels fold it (transformer_engine/common/util/
  // vectorized_pointwise.h, unary_kernel: max = fmaxf(fabsf(temp), max)): a NaN element is skipped, an inf
  // wins. The NaN itself still quantizes to the NaN code.
  float amax = 0.0f;
  for (std::size_t i = 0; i < n; ++i) amax = std::fmax(std::fabs(v[i]), amax);
  Fp8Quantized q;
  q.rows = matrix.size(0);
  q.cols = matrix.size(1);
  q.format = fp8_operand_format(operand, options.formats);
  q.amax = amax;
  if (options.recipe == Fp8Recipe::delayed) {
    if (state == nullptr) throw Error("fp8_quantize_operand: delayed scaling needs the module's state");
    DelayedScalingState& s = state->operand(operand);
    q.scale = s.scale;  // computed at the end of the previous step
    q.scale_inv = s.scale_inv;
    record_amax(s, amax);
  } else {
    q.scale = current_scaling_scale(amax, q.format, options.current);
    q.scale_inv = 1.0f / q.scale;
  }
  q.codes = quantize_fp8(std::span<const float>(v, n), q.scale, q.format);
  // The probe's FP8 statistics (underflow, saturation, error) need the values and the codes side by side:
  // only here are both at hand.
  if (probe::Hook* hook = probe::hook()) {
    probe::Fp8QuantizeEvent event{probe::current_step(), module, fp8_operand_name(operand),
                                  q.format == Fp8Format::e4m3 ? "e4m3" : "e5m2",
                                  std::span<const float>(v, n), q.codes, q.amax, q.scale, q.scale_inv};
    // The history that sets the next scale (the probe records its state: /fp8 history_amax).
    if (options.recipe == Fp8Recipe::delayed) {
      event.amax_history = state->operand(operand).amax_history;
      event.most_recent = options.delayed.algo == AmaxAlgo::most_recent;
    }
    hook->on_fp8_quantize(event);
  }
  return q;
}

Tensor fp8_gemm(const Fp8Quantized& a, bool transpose_a, const Fp8Quantized& b, bool transpose_b, DType out_dtype,
                const Tensor& bias) {
  const std::int64_t I = transpose_a ? a.cols : a.rows, P = transpose_a ? a.rows : a.cols;
  const std::int64_t Pb = transpose_b ? b.cols : b.rows, J = transpose_b ? b.rows : b.cols;
  if (P != Pb) {
    throw ShapeError(fmt::format("fp8_gemm: inner sizes differ ([{}, {}] times [{}, {}])", I, P, Pb, J));
  }
  if (!a.device.is_cpu() || !b.device.is_cpu()) return fp8_gemm_device(a, transpose_a, b, transpose_b, out_dtype, bias);
  std::vector<float> bias_f;
  if (bias.defined()) {
    if (bias.numel() != J) throw ShapeError(fmt::format("fp8_gemm: bias of {} elements for {} columns", bias.numel(), J));
    const Tensor bf = bias.to(DType::f32).contiguous().to(Device::cpu());
    bias_f.assign(bf.data_as<float>(), bf.data_as<float>() + J);
  }
  const std::vector<float> A = decoded(a, transpose_a);  // [I, P]
  const std::vector<float> B = decoded(b, transpose_b);  // [P, J]
  const float alpha = a.scale_inv * b.scale_inv;
  Tensor out = Tensor::empty({I, J}, {DType::f32, Device::cpu()});
  decoded_gemm(A.data(), B.data(), out.data_as<float>(), I, P, J, alpha, bias_f.empty() ? nullptr : bias_f.data());
  return out.to(out_dtype);
}

}  // namespace ampscope
