#include "core/random.h"

#include <fmt/format.h>

#include "core/error.h"

namespace ampscope {

namespace {
Tensor random_tensor(std::string_view op, Op kernel, const Shape& shape, Generator& gen, TensorOptions options) {
  if (!is_floating(options.dtype)) {
    throw DTypeError(fmt::format("{}: dtype {} is not a floating-point type (use f64, f32, f16 or bf16)", op,
                                 dtype_name(options.dtype)));
  }
  Tensor t = Tensor::empty(shape, options);
  const std::uint64_t offset = gen.advance(static_cast<std::uint64_t>(t.numel()));
  run_kernel(op, kernel, t, {}, {}, gen.seed(), offset);
  return t;
}
}  // namespace

Tensor rand(const Shape& shape, Generator& gen, TensorOptions options) {
  return random_tensor("rand", Op::uniform, shape, gen, options);
}

Tensor randn(const Shape& shape, Generator& gen, TensorOptions options) {
  return random_tensor("randn", Op::normal, shape, gen, options);
}

}  // namespace ampscope
