// tests/scaler/extensions_test.cpp: the loss-scaling extensions of core/grad_scaler.h (Megatron-LM's
// hysteresis, DeepSpeed's delayed shift, consecutive hysteresis, minimum and maximum scale, the error at
// the minimum), against reference/amp-semantics.md section 4.
//
// Expected values: the 4.3 table, and literal transcriptions of Megatron's DynamicGradScaler.update and
// DeepSpeed's DynamicLossScaler.update_scale (4.1, 4.2: Megatron's tracker that keeps falling below
// zero, DeepSpeed's iteration counter and last-overflow window) run side by side with the scaler on long
// overflow patterns. All scales are powers of two, so the references' double arithmetic is exact.
#include "core/grad_scaler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "core/ops.h"
#include "core/optim.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Runs PyTorch's loop once per entry of `overflow` on a one-parameter model (an inf is put in the
// gradient where overflow[i]) and returns the scale after each update().
struct ToyLoop {
  Tensor w = from_values({1.0, 1.0}, {2}).requires_grad_();
  optim::SGD opt{std::vector<Tensor>{w}, {.lr = 0.125}};

  void iteration(GradScaler& scaler, bool overflow) {
    opt.zero_grad();
    scaler.scale(sum(mul(w, from_values({1.0, -2.0}, {2})))).backward();
    if (overflow) w.grad().set({0}, kInf);
    scaler.step(opt);
    scaler.update();
  }
};

std::vector<double> scales_after(GradScaler& scaler, const std::vector<bool>& overflow) {
  ToyLoop run;
  std::vector<double> out;
  for (bool o : overflow) {
    run.iteration(scaler, o);
    out.push_back(scaler.get_scale());
  }
  return out;
}

// 4.1, Megatron-LM DynamicGradScaler.update(found_inf), as written there.
struct MegatronReference {
  double scale, min_scale, growth_factor, backoff_factor;
  std::int64_t growth_interval, hysteresis;
  std::int64_t growth_tracker = 0, hysteresis_tracker;

  MegatronReference(double initial, double min, std::int64_t interval, std::int64_t hyst)
      : scale(initial), min_scale(min), growth_factor(2.0), backoff_factor(0.5), growth_interval(interval),
        hysteresis(hyst), hysteresis_tracker(hyst) {}

  void update(bool found_inf) {
    if (found_inf) {
      growth_tracker = 0;
      hysteresis_tracker -= 1;
      if (hysteresis_tracker <= 0) scale = std::max(scale * backoff_factor, min_scale);
    } else {
      growth_tracker += 1;
      if (growth_tracker == growth_interval) {
        growth_tracker = 0;
        hysteresis_tracker = hysteresis;
        scale = scale * growth_factor;
      }
    }
  }
};

// 4.2, DeepSpeed DynamicLossScaler.update_scale(overflow), as written there. update() returns false
// where DeepSpeed raises at the minimum.
struct DeepSpeedReference {
  double cur_scale, min_scale, scale_factor = 2.0;
  std::int64_t scale_window, delayed_shift;
  bool consecutive_hysteresis, raise_error_at_min_scale;
  std::int64_t cur_iter = 0, last_overflow_iter = -1, cur_hysteresis;

  DeepSpeedReference(double init, double min, std::int64_t window, std::int64_t shift, bool consecutive, bool raise)
      : cur_scale(init), min_scale(min), scale_window(window), delayed_shift(shift),
        consecutive_hysteresis(consecutive), raise_error_at_min_scale(raise), cur_hysteresis(shift) {}

  bool update(bool overflow) {
    if (overflow) {
      if (delayed_shift == 1 || cur_hysteresis == 1) {
        if (cur_scale == min_scale && raise_error_at_min_scale) return false;
        cur_scale = std::max(cur_scale / scale_factor, min_scale);
      } else {
        cur_hysteresis -= 1;
      }
      last_overflow_iter = cur_iter;
    } else {
      if (consecutive_hysteresis) cur_hysteresis = delayed_shift;
      if ((cur_iter - last_overflow_iter) % scale_window == 0) {
        if (!consecutive_hysteresis) cur_hysteresis = delayed_shift;
        cur_scale *= scale_factor;
      }
    }
    cur_iter += 1;
    return true;
  }
};

// A reproducible overflow pattern: a run of rare overflows (the scale climbs), a run of frequent ones
// (it falls to the minimum), and a mixed run. A 64-bit LCG, so the test needs no generator of ours.
std::vector<bool> overflow_pattern(int n) {
  std::vector<bool> out;
  std::uint64_t state = 12345;
  for (int i = 0; i < n; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const double u = static_cast<double>(state >> 11) * 0x1p-53;
    const double p = i < n / 3 ? 0.1 : i < 2 * n / 3 ? 0.6 : 0.3;
    out.push_back(u < p);
  }
  return out;
}

// The pattern of reference 1.14 used in 4.3.
const std::vector<bool> kPattern = {false, false, false, true, false, true, true, false, false, false};

GradScalerOptions megatron_like(double init, double min, std::int64_t interval, std::int64_t hysteresis) {
  GradScalerOptions o = megatron_scaler_options();
  o.device = "cpu";
  o.init_scale = init;
  o.growth_interval = interval;
  o.extensions.min_scale = min;
  o.extensions.hysteresis = hysteresis;
  return o;
}

GradScalerOptions deepspeed_like(double init, double min, std::int64_t window, std::int64_t shift, bool consecutive,
                                 bool raise) {
  GradScalerOptions o = deepspeed_scaler_options();
  o.device = "cpu";
  o.init_scale = init;
  o.growth_interval = window;
  o.extensions.min_scale = min;
  o.extensions.hysteresis = shift;
  o.extensions.consecutive_hysteresis = consecutive;
  o.extensions.raise_at_min_scale = raise;
  return o;
}

// ---- the 4.3 table ----

TEST(loss_scale_extensions_test, megatron_row_of_the_pattern_table) {
  GradScaler scaler(megatron_like(65536, 1, 3, 2));
  EXPECT_EQ(scales_after(scaler, kPattern),
            (std::vector<double>{65536, 65536, 131072, 131072, 131072, 65536, 32768, 32768, 32768, 65536}));
}

TEST(loss_scale_extensions_test, deepspeed_row_of_the_pattern_table) {
  GradScaler scaler(deepspeed_like(65536, 1, 3, 2, false, true));
  EXPECT_EQ(scales_after(scaler, kPattern),
            (std::vector<double>{65536, 65536, 131072, 131072, 131072, 65536, 32768, 32768, 32768, 65536}));
}

TEST(loss_scale_extensions_test, deepspeed_consecutive_row_of_the_pattern_table) {
  GradScaler scaler(deepspeed_like(65536, 1, 3, 2, true, true));
  EXPECT_EQ(scales_after(scaler, kPattern),
            (std::vector<double>{65536, 65536, 131072, 131072, 131072, 131072, 65536, 65536, 65536, 131072}));
}

// ---- against literal transcriptions of Megatron and DeepSpeed ----

TEST(loss_scale_extensions_test, follows_megatrons_update_step_for_step) {
  for (std::int64_t hysteresis : {1, 2, 3}) {
    const std::vector<bool> pattern = overflow_pattern(240);
    MegatronReference ref(256.0, 1.0, 3, hysteresis);
    GradScaler scaler(megatron_like(256.0, 1.0, 3, hysteresis));
    ToyLoop run;
    int backoffs_at_min = 0;
    for (std::size_t i = 0; i < pattern.size(); ++i) {
      ref.update(pattern[i]);
      run.iteration(scaler, pattern[i]);
      ASSERT_EQ(scaler.get_scale(), ref.scale) << "hysteresis " << hysteresis << ", iteration " << i;
      ASSERT_EQ(scaler.get_growth_tracker(), ref.growth_tracker) << "iteration " << i;
      if (hysteresis > 1) {
        // Megatron's tracker falls below 1 after the backoff; ours stops at 1 (DeepSpeed's form).
        ASSERT_EQ(scaler.get_hysteresis_tracker(), std::max<std::int64_t>(ref.hysteresis_tracker, 1));
      }
      backoffs_at_min += pattern[i] && ref.scale == 1.0 ? 1 : 0;
    }
    EXPECT_GT(backoffs_at_min, 0) << "the pattern should reach the minimum scale";
  }
}

TEST(loss_scale_extensions_test, follows_deepspeeds_update_scale_step_for_step) {
  for (bool consecutive : {false, true}) {
    for (std::int64_t shift : {1, 2, 3}) {
      const std::vector<bool> pattern = overflow_pattern(240);
      DeepSpeedReference ref(256.0, 1.0, 3, shift, consecutive, false);
      GradScaler scaler(deepspeed_like(256.0, 1.0, 3, shift, consecutive, false));
      ToyLoop run;
      for (std::size_t i = 0; i < pattern.size(); ++i) {
        ASSERT_TRUE(ref.update(pattern[i]));
        run.iteration(scaler, pattern[i]);
        ASSERT_EQ(scaler.get_scale(), ref.cur_scale)
            << "consecutive " << consecutive << ", delayed_shift " << shift << ", iteration " << i;
        if (shift > 1) {
          ASSERT_EQ(scaler.get_hysteresis_tracker(), ref.cur_hysteresis) << "iteration " << i;
        }
      }
    }
  }
}

TEST(loss_scale_extensions_test, raises_at_the_minimum_where_deepspeed_does) {
  for (bool consecutive : {false, true}) {
    // Ends in a run of overflows so that both modes reach the minimum and raise.
    std::vector<bool> pattern = overflow_pattern(240);
    pattern.insert(pattern.end(), 64, true);
    DeepSpeedReference ref(256.0, 1.0, 3, 2, consecutive, true);
    GradScaler scaler(deepspeed_like(256.0, 1.0, 3, 2, consecutive, true));
    ToyLoop run;
    std::size_t i = 0;
    for (; i < pattern.size() && ref.update(pattern[i]); ++i) {
      run.iteration(scaler, pattern[i]);
      ASSERT_EQ(scaler.get_scale(), ref.cur_scale) << "iteration " << i;
    }
    ASSERT_LT(i, pattern.size()) << "the pattern should make DeepSpeed raise";
    const double scale = scaler.get_scale();
    const std::int64_t tracker = scaler.get_growth_tracker();
    EXPECT_THROW_MSG(run.iteration(scaler, pattern[i]), GradScalerError,
                     "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.");
    // Nothing changed.
    EXPECT_EQ(scaler.get_scale(), scale);
    EXPECT_EQ(scale, 1.0);
    EXPECT_EQ(scaler.get_growth_tracker(), tracker);
  }
}

// ---- bounds ----

TEST(loss_scale_extensions_test, min_scale_bounds_the_backoff) {
  GradScaler scaler({.device = "cpu", .init_scale = 4.0, .extensions = {.min_scale = 1.5}});
  EXPECT_EQ(scales_after(scaler, {true, true, true}), (std::vector<double>{2.0, 1.5, 1.5}));
}

TEST(loss_scale_extensions_test, max_scale_bounds_the_growth) {
  GradScaler scaler({.device = "cpu", .init_scale = 4.0, .growth_interval = 1, .extensions = {.max_scale = 10.0}});
  EXPECT_EQ(scales_after(scaler, {false, false, false}), (std::vector<double>{8.0, 10.0, 10.0}));
}

TEST(loss_scale_extensions_test, hysteresis_skips_the_step_but_keeps_the_scale) {
  GradScaler scaler({.device = "cpu", .init_scale = 64.0, .extensions = {.hysteresis = 2}});
  ToyLoop run;
  const std::vector<double> before = run.w.values();
  EXPECT_EQ(scaler.get_hysteresis_tracker(), 2);
  run.iteration(scaler, true);
  EXPECT_EQ(run.w.values(), before);  // skipped
  EXPECT_EQ(scaler.get_scale(), 64.0);
  EXPECT_EQ(scaler.get_hysteresis_tracker(), 1);
  run.iteration(scaler, false);  // a clean step alone does not refill it (non-consecutive)
  EXPECT_EQ(scaler.get_hysteresis_tracker(), 1);
  run.iteration(scaler, true);
  EXPECT_EQ(scaler.get_scale(), 32.0);
}

// ---- configuration ----

TEST(loss_scale_extensions_test, refuses_invalid_extensions) {
  EXPECT_THROW_MSG(GradScaler({.device = "cpu", .extensions = {.hysteresis = 0}}), GradScalerError,
                   "hysteresis must be >= 1", "got 0");
  EXPECT_THROW_MSG(GradScaler({.device = "cpu", .init_scale = 4.0, .extensions = {.min_scale = 8.0}}),
                   GradScalerError, "min_scale must be > 0 and <= init_scale", "min_scale=8.0", "init_scale=4.0");
  EXPECT_THROW_MSG(GradScaler({.device = "cpu", .extensions = {.min_scale = 0.0}}), GradScalerError,
                   "min_scale must be > 0");
  EXPECT_THROW_MSG(GradScaler({.device = "cpu", .init_scale = 4.0, .extensions = {.max_scale = 2.0}}),
                   GradScalerError, "max_scale must be >= init_scale");
  EXPECT_THROW_MSG(GradScaler({.device = "cpu", .extensions = {.raise_at_min_scale = true}}), GradScalerError,
                   "raise_at_min_scale needs a min_scale");
  // A disabled scaler checks nothing.
  EXPECT_NO_THROW(GradScaler({.device = "cpu", .enabled = false, .extensions = {.hysteresis = 0}}));
}

TEST(loss_scale_extensions_test, presets_carry_megatrons_and_deepspeeds_defaults) {
  const GradScalerOptions m = megatron_scaler_options();
  EXPECT_EQ(m.init_scale, 4294967296.0);
  EXPECT_EQ(m.growth_factor, 2.0);
  EXPECT_EQ(m.backoff_factor, 0.5);
  EXPECT_EQ(m.growth_interval, 1000);
  EXPECT_EQ(m.extensions.hysteresis, 2);
  EXPECT_EQ(m.extensions.min_scale, 1.0);
  EXPECT_FALSE(m.extensions.raise_at_min_scale);
  const GradScalerOptions d = deepspeed_scaler_options();
  EXPECT_EQ(d.init_scale, 65536.0);
  EXPECT_EQ(d.growth_interval, 1000);
  EXPECT_EQ(d.extensions.hysteresis, 2);
  EXPECT_FALSE(d.extensions.consecutive_hysteresis);
  EXPECT_EQ(d.extensions.min_scale, 1.0);
  EXPECT_TRUE(d.extensions.raise_at_min_scale);
}

// ---- state dict ----

TEST(loss_scale_extensions_test, state_dict_adds_extension_keys_only_when_they_are_on) {
  EXPECT_EQ(GradScaler({.device = "cpu"}).state_dict().count("hysteresis"), 0u);
  GradScaler scaler(megatron_like(64.0, 1.0, 3, 3));
  ToyLoop run;
  run.iteration(scaler, true);  // hysteresis tracker 3 -> 2
  const StateDict sd = scaler.state_dict();
  EXPECT_EQ(sd.size(), 10u);  // 5 of PyTorch's, 5 extension keys (no max_scale)
  EXPECT_EQ(std::get<std::int64_t>(sd.at("hysteresis")), 3);
  EXPECT_EQ(std::get<std::int64_t>(sd.at("_hysteresis_tracker")), 2);
  EXPECT_EQ(std::get<double>(sd.at("min_scale")), 1.0);
  EXPECT_EQ(std::get<bool>(sd.at("consecutive_hysteresis")), false);
  EXPECT_EQ(std::get<bool>(sd.at("raise_at_min_scale")), false);
  EXPECT_EQ(sd.count("max_scale"), 0u);

  // Loaded into a plain scaler, it carries the extensions and the tracker over.
  GradScaler plain({.device = "cpu"});
  plain.load_state_dict(sd);
  EXPECT_EQ(plain.extensions().hysteresis, 3);
  EXPECT_EQ(plain.extensions().min_scale, 1.0);
  EXPECT_EQ(plain.get_hysteresis_tracker(), 2);
  EXPECT_EQ(plain.get_scale(), 64.0);
  ToyLoop run2;
  run2.iteration(plain, true);
  run2.iteration(plain, true);
  EXPECT_EQ(plain.get_scale(), 32.0);  // the second overflow since the load backs off, as it would have
}

TEST(loss_scale_extensions_test, loading_pytorchs_keys_keeps_the_extensions_and_refills_hysteresis) {
  GradScaler scaler(megatron_like(64.0, 1.0, 3, 2));
  ToyLoop run;
  run.iteration(scaler, true);
  ASSERT_EQ(scaler.get_hysteresis_tracker(), 1);
  GradScaler pytorch_like({.device = "cpu", .init_scale = 16.0});
  scaler.load_state_dict(pytorch_like.state_dict());
  EXPECT_EQ(scaler.get_scale(), 16.0);
  EXPECT_EQ(scaler.extensions().hysteresis, 2);
  EXPECT_EQ(scaler.get_hysteresis_tracker(), 2);
}

}  // namespace
}  // namespace ampscope
