// `ampscope train`'s loop and data: every sample trains on every precision, resume is bit-identical,
// and bad data files and values give errors that say what is wrong.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "samples/idx.h"
#include "probes/trace/reader.h"
#include "cli/run.h"
#include "tests/test_support.h"

namespace ampscope::samples {
namespace {

std::filesystem::path temp_dir() {
  const auto dir = std::filesystem::temp_directory_path() / ("ampscope_train_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

class every_sample_and_precision : public ::testing::TestWithParam<std::tuple<std::string, Precision>> {};

TEST_P(every_sample_and_precision, trains_a_few_steps_with_finite_losses) {
  TrainConfig c;
  c.sample = std::get<0>(GetParam());
  c.precision = std::get<1>(GetParam());
  c.steps = 2;
  c.batch = 4;
  c.device = "cpu";
  const TrainResult r = train(c);
  ASSERT_EQ(r.steps, 2);
  for (double loss : r.losses) EXPECT_TRUE(std::isfinite(loss)) << loss;
  EXPECT_EQ(r.skipped, 0);
  // Only fp16 scales its loss.
  EXPECT_EQ(r.scales[0], c.precision == Precision::fp16 ? 65536.0 : 1.0);
}

INSTANTIATE_TEST_SUITE_P(train, every_sample_and_precision,
                         ::testing::Combine(::testing::Values("mlp", "cnn", "transformer"),
                                            ::testing::Values(Precision::fp32, Precision::fp16, Precision::bf16)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::string(precision_name(std::get<1>(info.param)));
                         });

TEST(train_test, mlp_learns_its_task_in_fp16) {
  TrainConfig c;
  c.sample = "mlp";
  c.steps = 40;
  c.device = "cpu";
  const TrainResult r = train(c);
  EXPECT_LT(r.losses.back(), 0.5 * r.losses.front());
}

TEST(train_test, resume_continues_bit_identically) {
  const auto dir = temp_dir();
  TrainConfig full;
  full.sample = "transformer";
  full.steps = 4;
  full.batch = 2;
  full.device = "cpu";
  full.init_scale = 1024;
  full.growth_interval = 1;  // the scale changes every step, so the scaler's state must be restored
  const TrainResult whole = train(full);

  TrainConfig first = full;
  first.steps = 2;
  first.checkpoint = (dir / "ck.h5").string();
  first.checkpoint_every = 1;             // checkpoints saved while the trace writer runs
  first.out = (dir / "first.h5").string();
  train(first);
  TrainConfig second = full;
  second.steps = 2;
  second.seed = 99;  // everything must come from the checkpoint, not from the seed
  second.resume = first.checkpoint;
  const TrainResult rest = train(second);
  ASSERT_EQ(rest.losses.size(), 2u);
  EXPECT_EQ(rest.losses[0], whole.losses[2]);
  EXPECT_EQ(rest.losses[1], whole.losses[3]);
  EXPECT_EQ(rest.scales, (std::vector<double>{whole.scales[2], whole.scales[3]}));
  EXPECT_EQ(rest.final_scale, whole.final_scale);
  std::filesystem::remove_all(dir);
}

TEST(train_test, unknown_names_list_the_valid_ones) {
  TrainConfig c;
  c.sample = "resnet";
  EXPECT_THROW_MSG(train(c), Error, "unknown sample 'resnet'", "mlp, cnn, transformer");
  EXPECT_THROW_MSG(parse_precision("fp4"), Error, "unknown precision 'fp4'", "fp32, fp16, bf16, fp8, mxfp8, nvfp4");
  EXPECT_THROW_MSG(find_scenario("nan-everywhere"), Error, "unknown scenario 'nan-everywhere'", "--list-scenarios");
  c.sample = "mlp";
  c.device = "tpu";
  EXPECT_THROW_MSG(train(c), Error, "unknown device 'tpu'", "auto, cpu, cuda");
}

// ---- IDX files ----

void write_bytes(const std::filesystem::path& p, const std::vector<unsigned char>& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<unsigned char> idx_header(unsigned char type, std::vector<std::uint32_t> dims) {
  std::vector<unsigned char> b = {0, 0, type, static_cast<unsigned char>(dims.size())};
  for (std::uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(d >> s));
  }
  return b;
}

TEST(idx_test, reads_a_valid_file_and_rejects_bad_ones_by_name) {
  const auto dir = temp_dir();
  auto good = idx_header(0x08, {2, 3});
  for (int i = 0; i < 6; ++i) good.push_back(static_cast<unsigned char>(i * 10));
  write_bytes(dir / "good", good);
  const IdxArray a = read_idx((dir / "good").string());
  EXPECT_EQ(a.dims, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(a.data, (std::vector<std::uint8_t>{0, 10, 20, 30, 40, 50}));

  // 1f 8b is gzip's magic: decompressed, not refused (tests/train/idx_test.cpp); this one's header is cut.
  write_bytes(dir / "gz", {0x1f, 0x8b, 0x08, 0x00, 1, 2, 3});
  EXPECT_THROW_MSG(read_idx((dir / "gz").string()), Error, "is a gzip file that ends early");
  auto truncated = good;
  truncated.resize(truncated.size() - 2);
  write_bytes(dir / "short", truncated);
  EXPECT_THROW_MSG(read_idx((dir / "short").string()), Error, "short", "4 data bytes", "promises 6", "truncated");
  auto longer = good;
  longer.push_back(0);
  write_bytes(dir / "long", longer);
  EXPECT_THROW_MSG(read_idx((dir / "long").string()), Error, "longer than its header says");
  write_bytes(dir / "float", idx_header(0x0D, {1}));
  EXPECT_THROW_MSG(read_idx((dir / "float").string()), Error, "element type 0x0d");
  EXPECT_THROW_MSG(read_idx((dir / "missing").string()), Error, "cannot read IDX file", "missing': cannot open it: No such file or directory");

  // MNIST layout checks: images must be [N, 28, 28], with as many labels.
  write_bytes(dir / "train-images-idx3-ubyte", good);
  write_bytes(dir / "train-labels-idx1-ubyte", idx_header(0x08, {0}));
  EXPECT_THROW_MSG(load_mnist(dir.string(), "train"), Error, "train-images-idx3-ubyte", "[2, 3]", "[N, 28, 28]");
  std::filesystem::remove_all(dir);
}

TEST(idx_test, the_cnn_sample_trains_on_idx_files) {
  const auto dir = temp_dir();
  auto images = idx_header(0x08, {4, 28, 28});
  for (int i = 0; i < 4 * 784; ++i) images.push_back(static_cast<unsigned char>(i % 251));
  auto labels = idx_header(0x08, {4});
  for (unsigned char l : {3, 1, 4, 1}) labels.push_back(l);
  write_bytes(dir / "train-images-idx3-ubyte", images);
  write_bytes(dir / "train-labels-idx1-ubyte", labels);
  TrainConfig c;
  c.sample = "cnn";
  c.steps = 1;
  c.batch = 4;
  c.device = "cpu";
  c.data_dir = dir.string();
  EXPECT_EQ(train(c).steps, 1);
  labels.back() = 12;
  write_bytes(dir / "train-labels-idx1-ubyte", labels);
  EXPECT_THROW_MSG(train(c), Error, "label 12", "not a digit");
  std::filesystem::remove_all(dir);
}

TEST(train_test, a_run_that_fails_leaves_a_trace_marked_incomplete) {
  const auto dir = temp_dir();
  TrainConfig c;
  c.sample = "mlp";
  c.steps = 5;
  c.device = "cpu";
  c.out = (dir / "failed.h5").string();
  // The progress callback stands in for anything that throws in the middle of training.
  EXPECT_THROW(train(c, [](const StepReport& r) {
                 if (r.step == 2) throw Error("stopped by the test");
               }),
               Error);
  trace::TraceReader reader(c.out);
  EXPECT_FALSE(reader.complete());
  EXPECT_EQ(reader.steps().size(), 3u);  // every finished step is there
  c.out = (dir / "finished.h5").string();
  train(c);
  EXPECT_TRUE(trace::TraceReader(c.out).complete());
  std::filesystem::remove_all(dir);
}

TEST(train_test, a_checkpoint_folder_that_does_not_exist_fails_before_training) {
  TrainConfig c;
  c.sample = "mlp";
  c.steps = 1000000;  // would take long: the error must come first
  c.device = "cpu";
  c.checkpoint = "/nonexistent-folder/ck.h5";
  EXPECT_THROW_MSG(train(c), Error, "--checkpoint", "/nonexistent-folder", "does not exist");
}

TEST(train_test, resume_refuses_another_precision_naming_both) {
  const auto dir = temp_dir();
  TrainConfig c;
  c.sample = "mlp";
  c.steps = 1;
  c.device = "cpu";
  c.checkpoint = (dir / "ck.h5").string();
  train(c);
  TrainConfig again = c;
  again.checkpoint.clear();
  again.resume = c.checkpoint;
  again.precision = Precision::fp32;
  EXPECT_THROW_MSG(train(again), Error, "--resume", "precision 'fp16', not 'fp32'");
  std::filesystem::remove_all(dir);
}

// Another --batch on resume is allowed (a smaller one fits in memory) but is not the run it continues: the
// run says so, naming both; the same batch says nothing.
TEST(train_test, resume_with_another_batch_warns_naming_both) {
  const auto dir = temp_dir();
  TrainConfig c;
  c.sample = "mlp";
  c.steps = 1;
  c.batch = 8;
  c.device = "cpu";
  c.checkpoint = (dir / "ck.h5").string();
  train(c);
  TrainConfig again = c;
  again.checkpoint.clear();
  again.resume = c.checkpoint;
  const auto batch_warnings = [](const TrainResult& r) {
    std::vector<std::string> out;
    for (const std::string& w : r.warnings) {
      if (w.find("--batch") != std::string::npos) out.push_back(w);
    }
    return out;
  };
  EXPECT_TRUE(batch_warnings(train(again)).empty());
  again.batch = 4;
  const std::vector<std::string> warned = batch_warnings(train(again));
  ASSERT_EQ(warned.size(), 1u);
  EXPECT_NE(warned[0].find("written by a run with --batch 8 and resumed with --batch 4"), std::string::npos) << warned[0];
  EXPECT_NE(warned[0].find("resume with --batch 8"), std::string::npos) << warned[0];
  std::filesystem::remove_all(dir);
}

TEST(train_test, the_gradient_norm_is_measured_also_without_clipping) {
  TrainConfig c;
  c.sample = "mlp";
  c.steps = 2;
  c.device = "cpu";
  c.max_grad_norm = 0;
  const auto dir = temp_dir();
  c.out = (dir / "norm.h5").string();
  train(c);
  for (const trace::StepRow& row : trace::TraceReader(c.out).steps()) EXPECT_GT(row.grad_norm, 0.0) << row.step;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ampscope::samples
