// tests/core/fp8_recipe_test.cpp: TransformerEngine's delayed and current scaling (core/fp8_recipe.h)
// against worked traces written here.
//
// Expected scales are computed here in double and rounded once to float: for float operands the double
// quotient rounded to float is the correctly rounded float quotient, so `expected_scale` is an
// independent value that must equal the recipe's bit for bit. Expected histories are written out by hand
// for the first steps; longer runs are checked against a model written here (a window of the amaxes of
// the steps a module ran in), not against the code's own arithmetic.
#include "core/fp8_recipe.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <random>
#include <vector>

namespace ampscope {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// fp8_max * 2^-margin / amax, in double, rounded once to float.
float expected_scale(double fp8_max, int margin, float amax) {
  return static_cast<float>(std::ldexp(fp8_max, -margin) / static_cast<double>(amax));
}

#define EXPECT_BITS_EQ(a, b) EXPECT_EQ(bits_of(a), bits_of(b)) << (a) << " vs " << (b)

// One step of a module that ran: its cast saw `amax`, then the end-of-step update.
void step(DelayedScalingState& st, const DelayedScaling& r, float amax, Fp8Format f = Fp8Format::e4m3) {
  record_amax(st, amax);
  delayed_scaling_update(st, r, f);
}

TEST(Fp8DelayedScaling, StartsAtScaleOneWithAZeroHistory) {
  const DelayedScaling defaults;
  EXPECT_EQ(defaults.history_len, 1024);
  EXPECT_EQ(defaults.algo, AmaxAlgo::max);
  EXPECT_EQ(defaults.margin, 0.0f);
  const DelayedScalingState st = make_delayed_scaling_state(defaults);
  EXPECT_EQ(st.amax_history, std::vector<float>(1024, 0.0f));
  EXPECT_EQ(st.scale, 1.0f);
  EXPECT_EQ(st.scale_inv, 1.0f);
}

TEST(Fp8DelayedScaling, MaxOverHistoryWorkedTrace) {
  // Length 4, max, margin 0, E4M3. A spike (4) in step 2 holds the scale at 448/4 until it leaves the
  // window: it is part of the max computed at the end of steps 2, 3, 4 and 5, and gone at step 6.
  const DelayedScaling r{.history_len = 4, .algo = AmaxAlgo::max, .margin = 0};
  DelayedScalingState st = make_delayed_scaling_state(r);
  step(st, r, 2.0f);
  EXPECT_EQ(st.amax_history, (std::vector<float>{0, 0, 0, 2}));
  EXPECT_BITS_EQ(st.scale, 224.0f);
  EXPECT_BITS_EQ(st.scale_inv, 1.0f / 224.0f);
  step(st, r, 4.0f);
  EXPECT_EQ(st.amax_history, (std::vector<float>{0, 0, 2, 4}));
  EXPECT_BITS_EQ(st.scale, 112.0f);
  step(st, r, 1.0f);
  EXPECT_EQ(st.amax_history, (std::vector<float>{0, 2, 4, 1}));
  EXPECT_BITS_EQ(st.scale, 112.0f);
  step(st, r, 1.0f);
  EXPECT_EQ(st.amax_history, (std::vector<float>{0, 4, 1, 1}));
  EXPECT_BITS_EQ(st.scale, 112.0f);
  step(st, r, 3.0f);
  EXPECT_EQ(st.amax_history, (std::vector<float>{0, 1, 1, 3}));
  EXPECT_BITS_EQ(st.scale, 112.0f);  // 4 was still in the window when this max was taken
  step(st, r, 1.0f);
  EXPECT_EQ(st.amax_history, (std::vector<float>{0, 1, 3, 1}));
  EXPECT_BITS_EQ(st.scale, expected_scale(448, 0, 3.0f));
  EXPECT_BITS_EQ(st.scale_inv, 1.0f / expected_scale(448, 0, 3.0f));
}

TEST(Fp8DelayedScaling, MostRecentFollowsTheLastAmax) {
  const DelayedScaling r{.history_len = 4, .algo = AmaxAlgo::most_recent, .margin = 0};
  DelayedScalingState st = make_delayed_scaling_state(r);
  for (const float a : {2.0f, 4.0f, 0.3f, 1000.0f, 7.0f}) {
    step(st, r, a);
    EXPECT_BITS_EQ(st.scale, expected_scale(448, 0, a));
  }
  EXPECT_EQ(st.amax_history, (std::vector<float>{0, 0.3f, 1000.0f, 7.0f}));  // it still rolls
}

TEST(Fp8DelayedScaling, MarginsAndE5M2) {
  for (const int margin : {0, 1, 2, 5}) {
    const DelayedScaling r{.history_len = 8, .algo = AmaxAlgo::max, .margin = static_cast<float>(margin)};
    DelayedScalingState e4 = make_delayed_scaling_state(r);
    DelayedScalingState e5 = make_delayed_scaling_state(r);
    step(e4, r, 0.7f, Fp8Format::e4m3);
    step(e5, r, 0.7f, Fp8Format::e5m2);
    EXPECT_BITS_EQ(e4.scale, expected_scale(448, margin, 0.7f));
    EXPECT_BITS_EQ(e5.scale, expected_scale(57344, margin, 0.7f));
  }
  // margin 1 with amax 448: scale 0.5, so 448 maps to 224.
  const DelayedScaling r{.history_len = 2, .algo = AmaxAlgo::max, .margin = 1};
  DelayedScalingState st = make_delayed_scaling_state(r);
  step(st, r, 448.0f);
  EXPECT_BITS_EQ(st.scale, 0.5f);
  EXPECT_BITS_EQ(st.scale_inv, 2.0f);
}

TEST(Fp8DelayedScaling, ZeroAmaxAndModulesThatDidNotRunKeepTheirState) {
  const DelayedScaling r{.history_len = 3, .algo = AmaxAlgo::max, .margin = 0};
  DelayedScalingState ran = make_delayed_scaling_state(r);
  DelayedScalingState idle = make_delayed_scaling_state(r);
  step(ran, r, 8.0f);
  step(idle, r, 16.0f);
  EXPECT_BITS_EQ(idle.scale, 28.0f);
  const std::vector<float> idle_history = idle.amax_history;  // {0, 0, 16}
  EXPECT_EQ(idle_history, (std::vector<float>{0, 0, 16}));
  for (int s = 0; s < 5; ++s) {
    step(ran, r, 2.0f);
    delayed_scaling_update(idle, r, Fp8Format::e4m3);  // did not run: nothing recorded
    EXPECT_EQ(idle.amax_history, idle_history);
    EXPECT_BITS_EQ(idle.scale, 28.0f);
  }
  EXPECT_EQ(ran.amax_history, (std::vector<float>{0, 2, 2}));
  EXPECT_BITS_EQ(ran.scale, 224.0f);
  // Ran with an all-zero tensor: amax 0 is indistinguishable from not running (TE rolls only when
  // amax_history[0] != 0), so the history and scale stay; likewise for most_recent.
  step(ran, r, 0.0f);
  EXPECT_EQ(ran.amax_history, (std::vector<float>{0, 2, 2}));
  EXPECT_BITS_EQ(ran.scale, 224.0f);
  const DelayedScaling mr{.history_len = 3, .algo = AmaxAlgo::most_recent, .margin = 0};
  DelayedScalingState st = make_delayed_scaling_state(mr);
  step(st, mr, 4.0f);
  step(st, mr, 0.0f);
  EXPECT_BITS_EQ(st.scale, 112.0f);
  EXPECT_EQ(st.amax_history, (std::vector<float>{0, 0, 4}));
}

TEST(Fp8DelayedScaling, NonFiniteAmax) {
  // inf with max: it stays in the window for `len` updates and each keeps the previous scale.
  const DelayedScaling r{.history_len = 3, .algo = AmaxAlgo::max, .margin = 0};
  DelayedScalingState st = make_delayed_scaling_state(r);
  step(st, r, 2.0f);
  EXPECT_BITS_EQ(st.scale, 224.0f);
  step(st, r, kInf);
  EXPECT_BITS_EQ(st.scale, 224.0f);
  step(st, r, 1.0f);
  EXPECT_BITS_EQ(st.scale, 224.0f);
  step(st, r, 1.0f);
  EXPECT_BITS_EQ(st.scale, 224.0f);
  step(st, r, 1.0f);  // inf has left the window
  EXPECT_BITS_EQ(st.scale, 448.0f);

  // NaN with max: fmaxf skips it, so the other entries decide; it still rolls into the history.
  DelayedScalingState n = make_delayed_scaling_state(r);
  step(n, r, 2.0f);
  step(n, r, kNaN);
  EXPECT_BITS_EQ(n.scale, 224.0f);
  EXPECT_TRUE(std::isnan(n.amax_history[2]));
  step(n, r, 8.0f);
  EXPECT_BITS_EQ(n.scale, 56.0f);

  // NaN with most_recent, and as the only entry of a length-1 history: the previous scale stays.
  const DelayedScaling mr{.history_len = 3, .algo = AmaxAlgo::most_recent, .margin = 0};
  DelayedScalingState m = make_delayed_scaling_state(mr);
  step(m, mr, 4.0f);
  step(m, mr, kNaN);
  EXPECT_BITS_EQ(m.scale, 112.0f);
  step(m, mr, kInf);
  EXPECT_BITS_EQ(m.scale, 112.0f);
  const DelayedScaling one{.history_len = 1, .algo = AmaxAlgo::max, .margin = 0};
  DelayedScalingState o = make_delayed_scaling_state(one);
  step(o, one, 4.0f);
  EXPECT_EQ(o.amax_history, (std::vector<float>{0}));
  EXPECT_BITS_EQ(o.scale, 112.0f);
  step(o, one, kNaN);
  EXPECT_BITS_EQ(o.scale, 112.0f);

  // A tiny amax whose scale overflows float: FLT_MAX, and scale_inv = 1 / FLT_MAX.
  DelayedScalingState t = make_delayed_scaling_state(one);
  step(t, one, std::numeric_limits<float>::denorm_min());
  EXPECT_BITS_EQ(t.scale, FLT_MAX);
  EXPECT_BITS_EQ(t.scale_inv, static_cast<float>(1.0 / static_cast<double>(FLT_MAX)));
}

TEST(Fp8DelayedScaling, TransformerEnginesOwnAmaxCases) {
  // The cases TransformerEngine's recipe test puts through its fused update (amax_case zero, tiny,
  // normal, inf, nan): a length-1 history holding that amax, scale and scale_inv starting at 1.
  const DelayedScaling one{.history_len = 1, .algo = AmaxAlgo::max, .margin = 0};
  auto run = [&](float amax) {
    DelayedScalingState st = make_delayed_scaling_state(one);
    st.amax_history[0] = amax;
    delayed_scaling_update(st, one, Fp8Format::e4m3);
    return st;
  };
  EXPECT_BITS_EQ(run(0.0f).scale, 1.0f);
  EXPECT_BITS_EQ(run(kInf).scale, 1.0f);
  EXPECT_BITS_EQ(run(kNaN).scale, 1.0f);
  const float tiny = static_cast<float>(448.0 / static_cast<double>(FLT_MAX)) / 2;  // scale would be inf
  EXPECT_BITS_EQ(run(tiny).scale, FLT_MAX);
  EXPECT_BITS_EQ(run(tiny).scale_inv, 1.0f / FLT_MAX);
  EXPECT_BITS_EQ(run(0.6180339f).scale, expected_scale(448, 0, 0.6180339f));
  EXPECT_BITS_EQ(run(0.6180339f).scale_inv, 1.0f / expected_scale(448, 0, 0.6180339f));
}

TEST(Fp8DelayedScaling, RecordAmaxKeepsTheLargestAndNaNSticks) {
  const DelayedScaling r{.history_len = 2, .algo = AmaxAlgo::most_recent, .margin = 0};
  DelayedScalingState st = make_delayed_scaling_state(r);
  record_amax(st, 3.0f);
  record_amax(st, 5.0f);
  record_amax(st, 1.0f);
  EXPECT_EQ(st.amax_history[0], 5.0f);
  record_amax(st, kInf);
  EXPECT_EQ(st.amax_history[0], kInf);
  record_amax(st, kNaN);
  record_amax(st, 2.0f);
  EXPECT_TRUE(std::isnan(st.amax_history[0]));
}

TEST(Fp8DelayedScaling, LongRandomRunsMatchAWindowModel) {
  // Modules run in a random 70% of steps; amaxes span 2^-20 .. 2^20 with occasional spikes. The model:
  // the amaxes of the last `len` steps the module ran in; scale from the max (or the last) of them.
  std::mt19937 rng(34);
  std::uniform_real_distribution<double> log_amax(-20, 20);
  std::bernoulli_distribution runs(0.7), spike(0.02);
  for (const std::int64_t len : {1, 2, 16, 1024}) {
    for (const AmaxAlgo algo : {AmaxAlgo::max, AmaxAlgo::most_recent}) {
      for (const int margin : {0, 3}) {
        const DelayedScaling r{.history_len = len, .algo = algo, .margin = static_cast<float>(margin)};
        DelayedScalingState st = make_delayed_scaling_state(r);
        std::deque<float> window;
        float want_scale = 1.0f;
        for (int s = 0; s < 3000; ++s) {
          if (runs(rng)) {
            float a = static_cast<float>(std::exp2(log_amax(rng)));
            if (spike(rng)) a *= 65536.0f;
            record_amax(st, a);
            window.push_back(a);
            if (static_cast<std::int64_t>(window.size()) > len) window.pop_front();
            double m = 0;
            for (const float w : window) m = std::max(m, static_cast<double>(w));
            const float used = algo == AmaxAlgo::max ? static_cast<float>(m) : a;
            want_scale = expected_scale(57344, margin, used);
          }
          delayed_scaling_update(st, r, Fp8Format::e5m2);
          ASSERT_EQ(bits_of(st.scale), bits_of(want_scale)) << "len " << len << " step " << s;
        }
      }
    }
  }
}

TEST(Fp8DelayedScaling, BadSettingsAreRefused) {
  try {
    make_delayed_scaling_state({.history_len = 0});
    FAIL() << "history_len 0 accepted";
  } catch (const Fp8RecipeError& e) {
    EXPECT_STREQ(e.what(),
                 "delayed scaling: amax history length 0 is not at least 1\n"
                 "hint: use a length of 1 or more (TransformerEngine's default is 1024)");
  }
  EXPECT_THROW(make_delayed_scaling_state({.margin = kNaN}), Fp8RecipeError);
  DelayedScalingState st = make_delayed_scaling_state({.history_len = 4});
  EXPECT_THROW(record_amax(st, -1.0f), Fp8RecipeError);
  try {
    delayed_scaling_update(st, {.history_len = 8}, Fp8Format::e4m3);
    FAIL() << "mismatched history accepted";
  } catch (const Fp8RecipeError& e) {
    EXPECT_STREQ(e.what(),
                 "delayed scaling: the state's amax history has 4 entries but the recipe says 8\n"
                 "hint: make the state from the same recipe (make_delayed_scaling_state)");
  }
}

float pow2_floor(float x) { return std::ldexp(1.0f, std::ilogb(x)); }

TEST(Fp8CurrentScaling, ScaleFromThisTensorsAmax) {
  EXPECT_BITS_EQ(current_scaling_scale(3.0f, Fp8Format::e4m3), expected_scale(448, 0, 3.0f));
  EXPECT_BITS_EQ(current_scaling_scale(3.0f, Fp8Format::e5m2), expected_scale(57344, 0, 3.0f));
  // Power-of-two scales round down: 448/3 = 149.33 -> 128; 448/0.001 = 448000 -> 2^18.
  EXPECT_BITS_EQ(current_scaling_scale(3.0f, Fp8Format::e4m3, {.power_2_scale = true}), 128.0f);
  EXPECT_BITS_EQ(current_scaling_scale(0.001f, Fp8Format::e4m3, {.power_2_scale = true}), 262144.0f);
  EXPECT_BITS_EQ(current_scaling_scale(448.0f, Fp8Format::e4m3, {.power_2_scale = true}), 1.0f);
  // amax 0, inf, NaN: 1 (with or without power-of-two scales).
  for (const bool p2 : {false, true}) {
    EXPECT_BITS_EQ(current_scaling_scale(0.0f, Fp8Format::e4m3, {.power_2_scale = p2}), 1.0f);
    EXPECT_BITS_EQ(current_scaling_scale(kInf, Fp8Format::e4m3, {.power_2_scale = p2}), 1.0f);
    EXPECT_BITS_EQ(current_scaling_scale(kNaN, Fp8Format::e4m3, {.power_2_scale = p2}), 1.0f);
  }
  // The epsilon raises a small amax (0 included) before the division.
  EXPECT_BITS_EQ(current_scaling_scale(1e-10f, Fp8Format::e4m3, {.amax_epsilon = 1e-6f}),
                 expected_scale(448, 0, 1e-6f));
  EXPECT_BITS_EQ(current_scaling_scale(0.0f, Fp8Format::e4m3, {.amax_epsilon = 1e-6f}), expected_scale(448, 0, 1e-6f));
  EXPECT_BITS_EQ(current_scaling_scale(2.0f, Fp8Format::e4m3, {.amax_epsilon = 1e-6f}), 224.0f);
  // Overflowing scale: FLT_MAX, and with power-of-two scales 2^127.
  const float tiny = std::numeric_limits<float>::denorm_min();
  EXPECT_BITS_EQ(current_scaling_scale(tiny, Fp8Format::e4m3), FLT_MAX);
  EXPECT_BITS_EQ(current_scaling_scale(tiny, Fp8Format::e4m3, {.power_2_scale = true}), std::ldexp(1.0f, 127));
  // A sweep of amaxes against the double reference, plain and power-of-two.
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> log_amax(-30, 30);
  for (int i = 0; i < 100000; ++i) {
    const float a = static_cast<float>(std::exp2(log_amax(rng)));
    const float want = expected_scale(448, 0, a);
    ASSERT_EQ(bits_of(current_scaling_scale(a, Fp8Format::e4m3)), bits_of(want)) << a;
    ASSERT_EQ(bits_of(current_scaling_scale(a, Fp8Format::e4m3, {.power_2_scale = true})), bits_of(pow2_floor(want)))
        << a;
  }
}

}  // namespace
}  // namespace ampscope
