// A checkpoint written by a CUDA run resumes on the CPU backend and the other way round (issue 9, item 3:
// moving to another device is a main reason people save GradScaler state). For each direction
// (cpu -> cpu runs everywhere and checks the test itself; the three with cuda skip without a GPU):
//
//   1. a run of `ampscope train` (mlp, fp16, GradScaler at 1024 growing x2 every 3 clean steps) saves at
//      step 4, when the scale is 2048 and the growth tracker 1;
//   2. the file read into freshly built objects on the second device holds, bit for bit, what the same
//      file read on the CPU holds: parameters, every AdamW state tensor (exp_avg, exp_avg_sq) and its step,
//      hyper-parameters, the generator, the scaler's state and the step; the tensors live on the second
//      device;
//   3. a resumed run that trains no step saves a checkpoint equal, bit for bit, to the one it resumed from
//      (loaded onto the second device and written back from it);
//   4. the resumed run continues: 4 more steps with finite losses, no skips, and the scale sequence of an
//      uninterrupted run on the second device (2048, 2048, 4096, 4096: the carried tracker makes the growth
//      come after one step, not three); on the same device it ends bit-identical to the uninterrupted run.
//
// References: the scales and trackers come from GradScaler's rule, worked out in expected_scales()
// (powers of two, exact in double); the saved state is compared with the file as the CPU reads it.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "core/io/checkpoint.h"
#include "core/grad_scaler.h"
#include "core/optim.h"
#include "cli/run.h"
#include "tests/checkpoint/checkpoint_test_support.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

using testing::ScratchDir;
using testing::Snapshot;
using testing::snapshot;

constexpr std::int64_t kSaveStep = 4, kLastStep = 8;
constexpr double kInitScale = 1024.0;
constexpr std::int64_t kGrowthInterval = 3;

samples::TrainConfig run_config(const std::string& device, std::int64_t steps) {
  samples::TrainConfig c;
  c.sample = "mlp";
  c.precision = samples::Precision::fp16;
  c.device = device;
  c.steps = steps;
  c.batch = 16;
  c.seed = 5;
  c.init_scale = kInitScale;
  c.growth_interval = kGrowthInterval;
  return c;
}

// The scale each step in [begin, end) of a run without overflows uses: init_scale, doubled after every
// kGrowthInterval clean steps (PyTorch's update rule; the tracker counts clean steps since the last growth).
std::vector<double> expected_scales(std::int64_t begin, std::int64_t end) {
  std::vector<double> scales;
  double scale = kInitScale;
  std::int64_t tracker = 0;
  for (std::int64_t step = 0; step < end; ++step) {
    if (step >= begin) scales.push_back(scale);
    if (++tracker == kGrowthInterval) {
      scale *= 2;
      tracker = 0;
    }
  }
  return scales;
}

// The training objects of the run as train() builds them, but from another seed (so that nothing but the
// file can make them equal), on `device`, with a checkpoint `path` loaded into them.
struct Loaded {
  Generator gen{12345};
  std::unique_ptr<samples::SampleTask> task;
  std::unique_ptr<optim::AdamW> opt;
  Checkpoint ck;
};

std::unique_ptr<Loaded> load_on(const std::filesystem::path& path, Device device) {
  auto l = std::make_unique<Loaded>();
  samples::TrainConfig c = run_config("cpu", 0);
  c.seed = 12345;
  l->task = samples::find_sample(c.sample).make(c, l->gen);
  l->task->model().to(device);
  l->opt = std::make_unique<optim::AdamW>(l->task->model().parameters(),
                                          optim::OptimizerOptions{.lr = 0.5, .weight_decay = 0.0});
  const GradScaler template_scaler({.device = "cpu", .init_scale = 1.0, .growth_interval = 7});
  l->ck = Checkpoint{.model = &l->task->model(),
                     .optimizer = l->opt.get(),
                     .generators = {{"model", &l->gen}},
                     .states = {{"scaler", template_scaler.state_dict()}, {"run", StateDict{}}}};
  load_checkpoint(path, l->ck);
  return l;
}

// Snapshots are exact bits; on a difference this names the pieces rather than printing megabytes of hex.
void expect_same_state(const Snapshot& got, const Snapshot& want, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(got.model.size(), want.model.size());
  for (const auto& [name, bits] : want.model) {
    const auto it = got.model.find(name);
    EXPECT_TRUE(it != got.model.end() && it->second == bits) << "parameter " << name << " differs or is missing";
  }
  EXPECT_EQ(got.groups, want.groups);
  EXPECT_EQ(got.opt_state.size(), want.opt_state.size());
  for (const auto& [name, bits] : want.opt_state) {
    const auto it = got.opt_state.find(name);
    EXPECT_TRUE(it != got.opt_state.end() && it->second == bits)
        << "optimizer state of " << name << " differs or is missing";
  }
  EXPECT_EQ(got.generators, want.generators);
  EXPECT_EQ(got.states, want.states);
  EXPECT_EQ(got.step, want.step);
}

void expect_scaler_state(const Checkpoint& ck, double scale, std::int64_t growth_tracker) {
  const StateDict& s = ck.states.at("scaler");
  EXPECT_EQ(std::get<double>(s.at("scale")), scale);
  EXPECT_EQ(std::get<std::int64_t>(s.at("_growth_tracker")), growth_tracker);
  EXPECT_EQ(std::get<std::int64_t>(s.at("growth_interval")), kGrowthInterval);
}

class cross_device_test : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(cross_device_test, resumes_with_scale_growth_tracker_optimizer_state_and_step_carried_exactly) {
  const auto& [from, to] = GetParam();
  if (from == "cuda" || to == "cuda") SKIP_WITHOUT_GPU();
  const Device to_device = Device::parse(to);
  ScratchDir dir;

  // 1. The first run, saved at step 4.
  samples::TrainConfig first = run_config(from, kSaveStep);
  first.checkpoint = (dir / "step4.h5").string();
  const samples::TrainResult first_run = samples::train(first);
  ASSERT_EQ(first_run.skipped, 0) << "an overflow in the first run: the scale rule below does not apply";
  EXPECT_EQ(first_run.scales, expected_scales(0, kSaveStep));

  // 2. Read onto the second device: what the CPU reads from the file, bit for bit, living on that device.
  const auto reference = load_on(dir / "step4.h5", Device::cpu());
  const auto loaded = load_on(dir / "step4.h5", to_device);
  expect_same_state(snapshot(loaded->ck), snapshot(reference->ck), "step4.h5 read on " + to + " vs on cpu");
  EXPECT_EQ(loaded->ck.step, kSaveStep);
  expect_scaler_state(loaded->ck, 2048.0, 1);  // 1024 grew after steps 0..2; step 3 was clean
  std::int64_t with_state = 0;
  for (const Tensor& p : loaded->task->model().parameters()) {
    EXPECT_EQ(p.device(), to_device) << p.name();
    const optim::ParamState* s = loaded->opt->find_state(p);
    if (s == nullptr) continue;
    ++with_state;
    EXPECT_EQ(s->step, kSaveStep) << p.name();
    EXPECT_EQ(s->exp_avg.device(), to_device) << p.name();
    EXPECT_EQ(s->exp_avg_sq.device(), to_device) << p.name();
    EXPECT_EQ(s->exp_avg.dtype(), p.dtype()) << p.name();
  }
  EXPECT_EQ(with_state, static_cast<std::int64_t>(loaded->task->model().parameters().size()))
      << "every parameter has AdamW state after 4 steps";

  // 3. Loaded onto the second device and written back from it by a resumed run of no steps: the same bits.
  samples::TrainConfig round_trip = run_config(to, 0);
  round_trip.seed = 77;  // the seed comes from the checkpoint
  round_trip.resume = first.checkpoint;
  round_trip.checkpoint = (dir / "round_trip.h5").string();
  samples::train(round_trip);
  expect_same_state(snapshot(load_on(dir / "round_trip.h5", Device::cpu())->ck), snapshot(reference->ck),
                    "written back from " + to);

  // 4. The resumed run continues, with the scale sequence of an uninterrupted run on the second device.
  samples::TrainConfig resumed = run_config(to, kLastStep - kSaveStep);
  resumed.seed = 77;
  resumed.resume = first.checkpoint;
  resumed.checkpoint = (dir / "step8_resumed.h5").string();
  const samples::TrainResult resumed_run = samples::train(resumed);
  ASSERT_EQ(resumed_run.steps, kLastStep - kSaveStep);
  EXPECT_EQ(resumed_run.skipped, 0);
  for (double loss : resumed_run.losses) EXPECT_TRUE(std::isfinite(loss)) << loss;
  EXPECT_EQ(resumed_run.scales, expected_scales(kSaveStep, kLastStep));  // 2048, 2048, 4096, 4096

  samples::TrainConfig whole = run_config(to, kLastStep);
  whole.checkpoint = (dir / "step8_whole.h5").string();
  const samples::TrainResult whole_run = samples::train(whole);
  ASSERT_EQ(whole_run.scales.size(), static_cast<std::size_t>(kLastStep));
  EXPECT_EQ(resumed_run.scales, std::vector<double>(whole_run.scales.begin() + kSaveStep, whole_run.scales.end()));

  const auto resumed_end = load_on(dir / "step8_resumed.h5", Device::cpu());
  EXPECT_EQ(resumed_end->ck.step, kLastStep);
  expect_scaler_state(resumed_end->ck, 4096.0, 2);  // grew after step 5; steps 6 and 7 clean
  if (from == to) {
    // One device throughout: resuming changes nothing, bit for bit (the cpu -> cpu case is train_test's
    // resume test; cuda -> cuda checks that cuda's state reaches the file exactly).
    expect_same_state(snapshot(resumed_end->ck), snapshot(load_on(dir / "step8_whole.h5", Device::cpu())->ck),
                      "resumed vs uninterrupted on " + to);
  } else {
    // Another backend's arithmetic for steps 0..3: the losses are those of a training from weights that
    // differ by rounding, within backend_parity_test's drift tolerance for fp16 (3e-2 relative).
    for (std::size_t k = 0; k < resumed_run.losses.size(); ++k) {
      const double want = whole_run.losses[kSaveStep + k];
      EXPECT_NEAR(resumed_run.losses[k], want, 3e-2 * std::fabs(want)) << "step " << kSaveStep + k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(checkpoint, cross_device_test,
                         ::testing::Values(std::make_tuple("cpu", "cpu"), std::make_tuple("cuda", "cpu"),
                                           std::make_tuple("cpu", "cuda"), std::make_tuple("cuda", "cuda")),
                         [](const auto& info) { return std::get<0>(info.param) + "_to_" + std::get<1>(info.param); });

}  // namespace
}  // namespace ampscope
