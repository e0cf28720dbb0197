#include "samples/synthetic.h"

#include <cmath>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"

namespace ampscope::samples {

Dataset make_blobs(const BlobsConfig& c, Generator& gen) {
  NoGradGuard no_grad;
  const Tensor centres = mul(randn({c.classes, c.features}, gen), c.separation);
  const Tensor noise = mul(randn({c.samples, c.features}, gen), c.spread);
  std::vector<double> labels(static_cast<std::size_t>(c.samples));
  for (std::int64_t i = 0; i < c.samples; ++i) labels[i] = static_cast<double>(i % c.classes);
  const Tensor y = from_values(labels, {c.samples}, {DType::i64});
  return {add(embedding(y, centres), noise), y};
}

Dataset make_random_images(std::int64_t samples, Generator& gen) {
  NoGradGuard no_grad;
  const Tensor u = rand({samples}, gen);
  std::vector<double> labels(static_cast<std::size_t>(samples));
  const std::vector<double> v = u.values();
  for (std::int64_t i = 0; i < samples; ++i) labels[i] = std::floor(v[i] * 10.0);
  return {rand({samples, 1, 28, 28}, gen), from_values(labels, {samples}, {DType::i64})};
}

Dataset make_token_sequences(std::int64_t samples, std::int64_t length, std::int64_t vocab, Generator& gen) {
  NoGradGuard no_grad;
  const std::vector<double> u = rand({samples, length + 1}, gen, {DType::f64}).values();
  std::vector<double> x, y;
  for (std::int64_t s = 0; s < samples; ++s) {
    for (std::int64_t t = 0; t < length; ++t) {
      x.push_back(std::floor(u[s * (length + 1) + t] * static_cast<double>(vocab)));
      y.push_back(std::floor(u[s * (length + 1) + t + 1] * static_cast<double>(vocab)));
    }
  }
  return {from_values(x, {samples, length}, {DType::i64}), from_values(y, {samples, length}, {DType::i64})};
}

}  // namespace ampscope::samples
