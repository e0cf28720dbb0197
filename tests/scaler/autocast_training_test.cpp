// The "done when": an fp16 training loop written the PyTorch way (autocast forward, scale the
// loss, backward, unscale_, clip, step, update) on the CPU backend, where the overflow is real: with an
// initial scale of 2^30 the scaled gradients overflow f16 inside the linear layers' backward, the scaler
// backs off until they fit, then grows again every `growth_interval` clean steps.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "core/autocast.h"
#include "core/grad_scaler.h"
#include "core/ops.h"
#include "core/optim.h"
#include "samples/models.h"
#include "samples/synthetic.h"

namespace ampscope {
namespace {

TEST(autocast_training_test, scale_backs_off_from_real_f16_overflow_and_grows_as_pytorchs_rule_says) {
  Generator gen(0);
  auto model = samples::make_mlp({.in_features = 20, .hidden = 64, .classes = 4}, gen);
  const samples::Dataset data = samples::make_blobs({.samples = 128, .features = 20, .classes = 4}, gen);
  optim::Adam opt(model->parameters(), {.lr = 1e-2});
  const double init = std::ldexp(1.0, 30);
  GradScaler scaler({.device = "cpu", .init_scale = init, .growth_interval = 3});

  std::vector<double> scales;      // the scale each step's loss was multiplied by
  std::vector<bool> found;         // whether that step's gradients overflowed
  std::vector<double> losses;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    Tensor loss;
    {
      AutocastGuard autocast;
      Tensor logits = (*model)(data.x);
      ASSERT_EQ(logits.dtype(), DType::f16);
      loss = cross_entropy(logits, data.y);
      ASSERT_EQ(loss.dtype(), DType::f32);
    }
    scales.push_back(scaler.get_scale());
    scaler.scale(loss).backward();
    scaler.unscale_(opt);
    optim::clip_grad_norm_(model->parameters(), 10.0);
    std::vector<std::vector<double>> before;
    for (const Tensor& p : model->parameters()) before.push_back(p.values());
    const bool stepped = scaler.step(opt);
    found.push_back(!stepped);
    if (!stepped) {
      // A skipped step leaves every parameter exactly as it was.
      std::size_t i = 0;
      for (const Tensor& p : model->parameters()) EXPECT_EQ(p.values(), before[i++]) << p.name();
    }
    scaler.update();
    losses.push_back(loss.item());
  }

  // 2^30 times a gradient of order 1e-2 is far beyond 65504: the first step must overflow.
  EXPECT_TRUE(found[0]);
  // The scale sequence is PyTorch's rule (amp-semantics 1.9) applied to the found_inf sequence:
  // backoff x0.5 and tracker reset on inf; growth x2 after 3 consecutive clean steps.
  double scale = init;
  int tracker = 0;
  int clean = 0, skipped = 0;
  for (std::size_t i = 0; i < scales.size(); ++i) {
    ASSERT_EQ(scales[i], scale) << "step " << i;
    if (found[i]) {
      scale *= 0.5;
      tracker = 0;
      ++skipped;
    } else if (++tracker == 3) {
      scale *= 2.0;
      tracker = 0;
      ++clean;
    } else {
      ++clean;
    }
  }
  EXPECT_EQ(scaler.get_scale(), scale);
  EXPECT_GE(skipped, 5) << "2^30 needs several halvings before f16 gradients fit";
  EXPECT_GE(clean, 10);
  // Growth happened after the backoffs: the scale went down, then up again.
  bool grew_after_backoff = false;
  for (std::size_t i = 1; i < scales.size(); ++i) grew_after_backoff |= scales[i] > scales[i - 1] && i > 1;
  EXPECT_TRUE(grew_after_backoff);
  // And the model trained on the clean steps.
  EXPECT_LT(losses.back(), losses.front());
}

}  // namespace
}  // namespace ampscope
