#include "core/backend.h"

#include <fmt/format.h>

#include "core/error.h"

namespace ampscope {

std::string_view op_name(Op op) {
  switch (op) {
    case Op::fill: return "fill";
    case Op::copy: return "copy";
    case Op::arange: return "arange";
    case Op::uniform: return "uniform";
    case Op::normal: return "normal";
    case Op::add: return "add";
    case Op::sub: return "sub";
    case Op::mul: return "mul";
    case Op::div: return "div";
    case Op::add_scalar: return "add_scalar";
    case Op::mul_scalar: return "mul_scalar";
    case Op::neg: return "neg";
    case Op::relu: return "relu";
    case Op::exp: return "exp";
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

void Backend::register_kernel(Op op, DType dtype, KernelFn fn) {
  KernelFn& slot = table_[index(op)][index(dtype)];
  if (slot != nullptr) {
    throw Error(fmt::format("backend '{}': kernel for op '{}' at {} registered twice", name(), op_name(op), dtype_name(dtype)));
  }
  slot = fn;
}

}  // namespace ampscope
