// core/random.h: seeded random tensors from the Philox stream (core/philox.h). The same seed and
// offset give the same values on the CPU and on the GPU, so a run is reproducible across backends.
//
//   Generator gen(42);
//   Tensor w = randn({128, 64}, gen);                    // f32 on the CPU
//   Tensor u = rand({8}, gen, {.dtype = DType::f16});    // the next 8 values of the same stream
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace ampscope {

class Generator {
 public:
  explicit Generator(std::uint64_t seed = 0) : seed_(seed) {}

  void manual_seed(std::uint64_t seed) {
    seed_ = seed;
    offset_ = 0;
  }
  std::uint64_t seed() const { return seed_; }
  std::uint64_t offset() const { return offset_; }  // in Philox blocks of four 32-bit words
  void set_offset(std::uint64_t offset) { offset_ = offset; }

  // Reserves the blocks for n values and returns the first block's offset.
  std::uint64_t advance(std::uint64_t n) {
    const std::uint64_t first = offset_;
    offset_ += (n + 3) / 4;
    return first;
  }

 private:
  std::uint64_t seed_;
  std::uint64_t offset_ = 0;
};

// Uniform on [0, 1), with as many random bits as the dtype's significand holds (exact, never 1).
Tensor rand(const Shape& shape, Generator& gen, TensorOptions options = {});
// Standard normal (Box-Muller in double, rounded once to the dtype).
Tensor randn(const Shape& shape, Generator& gen, TensorOptions options = {});

}  // namespace ampscope
