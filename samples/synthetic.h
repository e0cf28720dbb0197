// samples/synthetic.h: seeded synthetic data sets, so that every sample, test and benchmark runs
// without downloads and gives the same numbers on every machine.
//
//   Generator gen(7);
//   Dataset d = make_blobs({.samples = 512, .features = 20, .classes = 4}, gen);  // d.x f32 [512, 20], d.y i64 [512]
#pragma once

#include <cstdint>

#include "core/random.h"
#include "core/tensor.h"

namespace ampscope::samples {

struct Dataset {
  Tensor x;  // inputs
  Tensor y;  // i64 class labels (or next tokens)
};

struct BlobsConfig {
  std::int64_t samples = 512;
  std::int64_t features = 20;
  std::int64_t classes = 4;
  double spread = 1.0;      // standard deviation of each class around its centre
  double separation = 2.0;  // standard deviation of the class centres
};
// Gaussian clusters, one per class, with centres drawn from N(0, separation^2); labels cycle 0, 1, ...
// so every class has the same number of samples.
Dataset make_blobs(const BlobsConfig& config, Generator& gen);

// MNIST-shaped images [N, 1, 28, 28] in [0, 1) with labels in [0, 10).
Dataset make_random_images(std::int64_t samples, Generator& gen);

// Token sequences [N, T] over `vocab` symbols with labels shifted by one (next-token prediction).
Dataset make_token_sequences(std::int64_t samples, std::int64_t length, std::int64_t vocab, Generator& gen);

}  // namespace ampscope::samples
