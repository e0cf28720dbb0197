// Resuming from a checkpoint continues a run bit for bit: a run of 20 steps and a run of 10 steps that is
// saved, loaded into freshly built objects (built from a different seed, so nothing carries over but the
// file) and continued for 10 steps end with the same parameter bits, optimizer state and generator
// state, and draw the same dropout masks on the way. Once with fresh objects in this process, once in a
// genuinely new process (this test program started again), and once for a bf16 transformer with AdamW
// and a warm-up/cosine schedule.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/io/checkpoint.h"
#include "core/optim.h"
#include "samples/models.h"
#include "samples/synthetic.h"
#include "tests/checkpoint/checkpoint_test_support.h"

extern char** environ;

namespace ampscope {
namespace {

using testing::make_small_net;
using testing::ScratchDir;
using testing::snapshot;
using testing::train_steps;

constexpr int kSaveStep = 10, kLastStep = 20;
constexpr char kChildDirVariable[] = "AMPSCOPE_CHECKPOINT_CHILD_DIR";

// One training run of the small dropout MLP with Adam and a StepLR schedule. The scheduler is rebuilt
// from the step on resume, as a user would (its epoch is the checkpoint's step).
struct MlpRun {
  explicit MlpRun(std::uint64_t seed) : gen(seed), net(make_small_net(gen)) {
    opt = std::make_unique<optim::Adam>(net.model->parameters(), optim::OptimizerOptions{.lr = 1e-2});
    sched = std::make_unique<optim::StepLR>(*opt, 4, 0.5);
  }
  MlpRun(const MlpRun&) = delete;
  MlpRun& operator=(const MlpRun&) = delete;

  Checkpoint checkpoint(std::int64_t step) {
    return {.model = net.model.get(), .optimizer = opt.get(), .generators = {{"dropout", &gen}}, .step = step};
  }
  void load(const std::filesystem::path& file) {
    Checkpoint ck = checkpoint(0);
    load_checkpoint(file, ck);
    ASSERT_EQ(ck.step, kSaveStep);
    sched = std::make_unique<optim::StepLR>(*opt, 4, 0.5, /*last_epoch=*/ck.step - 1);
  }
  void train(int from, int to) { train_steps(*net.model, *opt, from, to, sched.get()); }

  Generator gen;
  testing::SmallNet net;
  std::unique_ptr<optim::Adam> opt;
  std::unique_ptr<optim::StepLR> sched;
};

// The uninterrupted reference: 20 steps, keeping the masks of steps 10..19.
struct Reference {
  testing::Snapshot end;
  std::vector<std::vector<std::int64_t>> masks;
};

Reference uninterrupted() {
  MlpRun run(1);
  run.train(0, kSaveStep);
  run.net.drop->masks.clear();
  run.train(kSaveStep, kLastStep);
  return {snapshot(run.checkpoint(kLastStep)), run.net.drop->masks};
}

// The first half of the interrupted run, saved at step 10.
void first_half(const std::filesystem::path& file) {
  MlpRun run(1);
  run.train(0, kSaveStep);
  save_checkpoint(file, run.checkpoint(kSaveStep));
}

std::int64_t count_dropped(const std::vector<std::vector<std::int64_t>>& masks) {
  std::int64_t n = 0;
  for (const auto& m : masks) n += std::count(m.begin(), m.end(), 0);
  return n;
}

TEST(resume_test, a_run_resumed_from_step_10_in_fresh_objects_ends_bit_identical_to_an_uninterrupted_run) {
  ScratchDir dir;
  const Reference reference = uninterrupted();
  ASSERT_GT(count_dropped(reference.masks), 0) << "the reference run dropped nothing: dropout is not exercised";
  first_half(dir / "step10.h5");

  MlpRun resumed(99);  // different initial parameters, generator state and hyper-parameters until loaded
  ASSERT_NE(snapshot(resumed.checkpoint(kLastStep)).model, reference.end.model);
  resumed.load(dir / "step10.h5");
  resumed.train(kSaveStep, kLastStep);

  EXPECT_TRUE(snapshot(resumed.checkpoint(kLastStep)) == reference.end)
      << "parameters, optimizer state, lr or generator differ after resuming";
  EXPECT_EQ(resumed.net.drop->masks, reference.masks);

  // The same resume without the generator's state draws other masks: the comparison above can fail.
  MlpRun no_generator(99);
  Checkpoint partial = no_generator.checkpoint(0);
  partial.generators.clear();
  load_checkpoint(dir / "step10.h5", partial);
  no_generator.sched = std::make_unique<optim::StepLR>(*no_generator.opt, 4, 0.5, kSaveStep - 1);
  no_generator.train(kSaveStep, kLastStep);
  EXPECT_NE(no_generator.net.drop->masks, reference.masks);
}

// ---- the same in a new process -------------------------------------------------------------------

// Child side: load step10.h5 into objects built from another seed, run steps 10..19, save step20.h5
// with the masks drawn.
void run_child(const std::filesystem::path& dir) {
  MlpRun resumed(99);
  resumed.load(dir / "step10.h5");
  resumed.train(kSaveStep, kLastStep);
  std::vector<double> flat;
  for (const auto& mask : resumed.net.drop->masks) flat.insert(flat.end(), mask.begin(), mask.end());
  const std::int64_t steps = static_cast<std::int64_t>(resumed.net.drop->masks.size());
  Checkpoint ck = resumed.checkpoint(kLastStep);
  const std::int64_t per_step = steps > 0 ? static_cast<std::int64_t>(flat.size()) / steps : 0;
  ck.states["masks"] = {{"steps_10_to_19", from_values(flat, {steps, per_step}, {.dtype = DType::i64})}};
  save_checkpoint(dir / "step20.h5", ck);
}

// Starts this test program again, running only this test, with the child variable set; returns its
// exit status and leaves its output in child.log.
int spawn_child(const std::filesystem::path& dir) {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string filter = std::string("--gtest_filter=") + info->test_suite_name() + "." + info->name();
  const std::string variable = std::string(kChildDirVariable) + "=" + dir.string();
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string_view(*e).starts_with("GTEST_OUTPUT=")) continue;  // the child must not overwrite our report
    env.push_back(*e);
  }
  env.push_back(const_cast<char*>(variable.c_str()));
  env.push_back(nullptr);
  std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  char* argv[] = {exe.data(), const_cast<char*>(filter.c_str()), nullptr};
  const std::string log = (dir / "child.log").string();
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv, env.data());
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(resume_test, a_run_resumed_from_step_10_in_a_new_process_ends_bit_identical_to_an_uninterrupted_run) {
  if (const char* child_dir = std::getenv(kChildDirVariable)) {
    run_child(child_dir);
    return;
  }
  ScratchDir dir;
  const Reference reference = uninterrupted();
  first_half(dir / "step10.h5");

  const int status = spawn_child(dir.path());
  std::stringstream log;
  log << std::ifstream(dir / "child.log").rdbuf();
  ASSERT_EQ(status, 0) << "the child process failed; its output:\n" << log.str();

  // Read what the child ended with into yet another set of fresh objects.
  MlpRun check(98);
  Checkpoint ck = check.checkpoint(0);
  ck.states["masks"] = {};
  load_checkpoint(dir / "step20.h5", ck);
  EXPECT_EQ(ck.step, kLastStep);
  const StateDict masks = ck.states.at("masks");
  ck.states.clear();
  EXPECT_TRUE(snapshot(ck) == reference.end) << "parameters, optimizer state, lr or generator differ";

  const Tensor drawn = std::get<Tensor>(masks.at("steps_10_to_19"));
  std::vector<std::int64_t> flat_reference;
  for (const auto& m : reference.masks) flat_reference.insert(flat_reference.end(), m.begin(), m.end());
  const std::vector<double> values = drawn.values();
  EXPECT_EQ(drawn.size(0), static_cast<std::int64_t>(reference.masks.size()));
  EXPECT_EQ(std::vector<std::int64_t>(values.begin(), values.end()), flat_reference);
}

// ---- a bf16 transformer with AdamW and warm-up/cosine --------------------------------------------

struct GptRun {
  explicit GptRun(std::uint64_t seed)
      : gen(seed),
        model(std::make_shared<samples::TinyTransformer>(
            samples::TinyTransformerConfig{.vocab = 16, .context = 8, .d_model = 16, .n_heads = 2, .n_layers = 2,
                                           .dropout = 0.1},
            gen)) {
    model->to(DType::bf16);
    opt = std::make_unique<optim::AdamW>(model->parameters(), optim::OptimizerOptions{.lr = 3e-3, .weight_decay = 0.1});
    sched = std::make_unique<optim::WarmupCosineLR>(*opt, 5, kLastStep);
  }
  GptRun(const GptRun&) = delete;
  GptRun& operator=(const GptRun&) = delete;

  Checkpoint checkpoint(std::int64_t step) {
    return {.model = model.get(), .optimizer = opt.get(), .generators = {{"init_and_dropout", &gen}}, .step = step};
  }
  void train(int from, int to) {
    static const samples::Dataset data = [] {
      Generator data_gen(5);
      return samples::make_token_sequences(32, 8, 16, data_gen);
    }();
    for (int step = from; step < to; ++step) {
      const std::int64_t b = (step % 4) * 8;
      const Tensor logits = (*model)(data.x.slice(0, b, b + 8));  // [8, 8, 16]
      Tensor loss = cross_entropy(logits.reshape({64, 16}), data.y.slice(0, b, b + 8).reshape({64}));
      opt->zero_grad();
      loss.backward();
      opt->step();
      sched->step();
    }
  }

  Generator gen;
  std::shared_ptr<samples::TinyTransformer> model;
  std::unique_ptr<optim::AdamW> opt;
  std::unique_ptr<optim::WarmupCosineLR> sched;
};

TEST(resume_test, a_bf16_transformer_with_adamw_and_a_warmup_cosine_schedule_resumes_bit_identically) {
  ScratchDir dir;
  GptRun reference(1);
  reference.train(0, kLastStep);

  GptRun first(1);
  first.train(0, kSaveStep);
  save_checkpoint(dir / "gpt.h5", first.checkpoint(kSaveStep));

  GptRun resumed(99);
  Checkpoint ck = resumed.checkpoint(0);
  load_checkpoint(dir / "gpt.h5", ck);
  resumed.sched = std::make_unique<optim::WarmupCosineLR>(*resumed.opt, 5, kLastStep, 1.0 / 3.0, 0.0, ck.step - 1);
  resumed.train(kSaveStep, kLastStep);

  const testing::Snapshot want = snapshot(reference.checkpoint(kLastStep));
  const testing::Snapshot got = snapshot(resumed.checkpoint(kLastStep));
  EXPECT_EQ(got.model.count("blocks.0.attn.qkv.weight"), 1u);
  EXPECT_TRUE(got == want) << "parameters, optimizer state, lr or generator differ after resuming";
  EXPECT_EQ(got.model, want.model);
}

}  // namespace
}  // namespace ampscope
