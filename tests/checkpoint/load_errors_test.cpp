// A checkpoint that does not fit, or is not a checkpoint at all, raises a CheckpointError that names the
// file and what is wrong, and leaves the model, optimizer, generators, StateDicts and step exactly as
// they were (compared bit for bit before and after the failed load).
#include <hdf5.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/checkpoint.h"
#include "core/optim.h"
#include "tests/checkpoint/checkpoint_test_support.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

using testing::make_small_net;
using testing::ScratchDir;
using testing::snapshot;
using testing::train_steps;

StateDict scaler_state() {
  return {{"scale", 65536.0},
          {"growth_factor", 2.0},
          {"backoff_factor", 0.5},
          {"growth_interval", std::int64_t{2000}},
          {"_growth_tracker", std::int64_t{3}}};
}

// A run in progress: a model with dropout, Adam after two steps, a generator, the scaler's state and a
// step counter, all reachable through `ck`. Built in place (the dropout layer points at `gen`).
struct LiveRun {
  explicit LiveRun(std::uint64_t seed, std::int64_t hidden = 16, bool fc2_bias = true, DType dtype = DType::f32)
      : gen(seed), net(make_small_net(gen, hidden, fc2_bias)) {
    net.model->to(dtype);
    opt = std::make_unique<optim::Adam>(net.model->parameters(), optim::OptimizerOptions{.lr = 1e-2});
    train_steps(*net.model, *opt, 0, 2);
    ck = {.model = net.model.get(),
          .optimizer = opt.get(),
          .generators = {{"dropout", &gen}},
          .states = {{"scaler", scaler_state()}},
          .step = 2};
  }
  LiveRun(const LiveRun&) = delete;
  LiveRun& operator=(const LiveRun&) = delete;

  Generator gen;
  testing::SmallNet net;
  std::unique_ptr<optim::Adam> opt;
  Checkpoint ck;
};

// Loads `file` into a live run (seed 2), expecting the error pieces, and checks that nothing changed.
#define EXPECT_LOAD_FAILS_UNTOUCHED(file, ...)                                                 \
  do {                                                                                         \
    LiveRun live_(2);                                                                              \
    const testing::Snapshot before_ = snapshot(live_.ck);                                      \
    EXPECT_THROW_MSG(load_checkpoint(file, live_.ck), CheckpointError, __VA_ARGS__);           \
    EXPECT_TRUE(snapshot(live_.ck) == before_) << "a failed load changed the live run";        \
  } while (0)

TEST(load_errors_test, a_parameter_of_another_shape_is_named_with_both_shapes) {
  ScratchDir dir;
  LiveRun saved(1, /*hidden=*/12);
  save_checkpoint(dir / "ckpt.h5", saved.ck);
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "ckpt.h5", "cannot load checkpoint '", "ckpt.h5': ",
                              "parameter 'fc1.weight' ('/model/fc1.weight') has shape [12, 8] in the checkpoint but "
                              "[16, 8] in the model",
                              "hint: build the model with the configuration of the run that saved the checkpoint");
}

TEST(load_errors_test, a_parameter_the_checkpoint_lacks_is_named) {
  ScratchDir dir;
  LiveRun saved(1, 16, /*fc2_bias=*/false);
  save_checkpoint(dir / "ckpt.h5", saved.ck);
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "ckpt.h5",
                              "the checkpoint has no parameter 'fc2.bias' ('/model/fc2.bias'), which the model has",
                              "hint: the checkpoint was saved from a different model");
}

TEST(load_errors_test, an_extra_parameter_in_the_checkpoint_is_named) {
  ScratchDir dir;
  LiveRun saved(1);
  save_checkpoint(dir / "ckpt.h5", saved.ck);
  LiveRun live(2, 16, /*fc2_bias=*/false);
  const testing::Snapshot before = snapshot(live.ck);
  EXPECT_THROW_MSG(load_checkpoint(dir / "ckpt.h5", live.ck), CheckpointError,
                   "the checkpoint has parameter 'fc2.bias' ('/model/fc2.bias'), which the model does not have");
  EXPECT_TRUE(snapshot(live.ck) == before);
}

TEST(load_errors_test, a_parameter_of_another_dtype_is_named_with_both_dtypes_and_a_hint) {
  ScratchDir dir;
  LiveRun saved(1, 16, true, DType::f16);
  save_checkpoint(dir / "ckpt.h5", saved.ck);
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "ckpt.h5",
                              "parameter 'fc1.weight' ('/model/fc1.weight') is f16 in the checkpoint but f32 in the "
                              "model",
                              "hint: convert the model with to(DType::f16) before loading");
}

TEST(load_errors_test, a_dataset_of_a_type_no_dtype_has_is_described) {
  ScratchDir dir;
  LiveRun saved(1);
  save_checkpoint(dir / "ckpt.h5", saved.ck);
  // Replace /model/fc1.weight by an int32 dataset of the same shape, with HDF5's own API.
  const hid_t f = H5Fopen((dir / "ckpt.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Ldelete(f, "/model/fc1.weight", H5P_DEFAULT), 0);
  const hsize_t dims[2] = {16, 8};
  const hid_t space = H5Screate_simple(2, dims, nullptr);
  const hid_t d = H5Dcreate2(f, "/model/fc1.weight", H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(d, 0);
  H5Dclose(d);
  H5Sclose(space);
  H5Fclose(f);
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "ckpt.h5",
                              "parameter 'fc1.weight' ('/model/fc1.weight') is a 4-byte HDF5 integer type in the "
                              "checkpoint but f32 in the model");
}

TEST(load_errors_test, another_optimizer_type_is_refused) {
  ScratchDir dir;
  LiveRun saved(1);
  optim::SGD sgd(saved.net.model->parameters(), {.lr = 0.1});
  saved.ck.optimizer = &sgd;
  save_checkpoint(dir / "ckpt.h5", saved.ck);
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "ckpt.h5", "the checkpoint holds SGD state, but the optimizer is Adam",
                              "hint: build a SGD optimizer");
}

TEST(load_errors_test, an_optimizer_over_other_parameters_names_the_one_that_differs) {
  ScratchDir dir;
  LiveRun saved(1);
  const auto params = saved.net.model->parameters();  // fc1.weight, fc1.bias, fc2.weight, fc2.bias
  optim::Adam partial(std::vector<Tensor>{params[0], params[1], params[2]});
  saved.ck.optimizer = &partial;
  save_checkpoint(dir / "ckpt.h5", saved.ck);
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "ckpt.h5",
                              "the optimizer's group 0 holds parameter 'fc2.bias', which the checkpoint's group 0 "
                              "lacks");
}

TEST(load_errors_test, an_optimizer_with_other_groups_is_refused_with_both_counts) {
  ScratchDir dir;
  LiveRun saved(1);
  const auto p = saved.net.model->parameters();
  optim::Adam grouped(std::vector<optim::ParamGroupSpec>{{.params = {p[0], p[1]}}, {.params = {p[2], p[3]}}});
  saved.ck.optimizer = &grouped;
  save_checkpoint(dir / "ckpt.h5", saved.ck);
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "ckpt.h5",
                              "the checkpoint's Adam has 2 parameter group(s), but the optimizer has 1");
}

TEST(load_errors_test, a_piece_the_file_lacks_is_named) {
  ScratchDir dir;
  LiveRun saved(1);
  saved.ck.optimizer = nullptr;
  save_checkpoint(dir / "no_optimizer.h5", saved.ck);
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "no_optimizer.h5", "the file holds no optimizer (no '/optimizer' group)");
  saved.ck.optimizer = saved.opt.get();
  saved.ck.generators.clear();
  save_checkpoint(dir / "no_generator.h5", saved.ck);
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "no_generator.h5",
                              "the file holds no generator 'dropout' (no '/generators/dropout')");
}

TEST(load_errors_test, a_scaler_state_without_a_key_names_the_key) {
  ScratchDir dir;
  LiveRun saved(1);
  saved.ck.states["scaler"].erase("_growth_tracker");
  save_checkpoint(dir / "ckpt.h5", saved.ck);
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "ckpt.h5", "state 'scaler' lacks key '_growth_tracker' (expected an integer)");
}

TEST(load_errors_test, a_scaler_value_of_another_type_names_both_types) {
  ScratchDir dir;
  LiveRun saved(1);
  saved.ck.states["scaler"]["scale"] = std::int64_t{65536};
  save_checkpoint(dir / "ckpt.h5", saved.ck);
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "ckpt.h5",
                              "state 'scaler' key 'scale' is an integer in the checkpoint, but a double is expected");
}

TEST(load_errors_test, an_unexpected_scaler_key_is_named) {
  ScratchDir dir;
  LiveRun saved(1);
  saved.ck.states["scaler"]["hysteresis"] = std::int64_t{2};
  save_checkpoint(dir / "ckpt.h5", saved.ck);
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "ckpt.h5",
                              "state 'scaler' has key 'hysteresis' (an integer), which is not expected");
}

TEST(load_errors_test, a_truncated_file_is_named_with_hdf5s_own_explanation) {
  ScratchDir dir;
  LiveRun saved(1);
  save_checkpoint(dir / "ckpt.h5", saved.ck);
  const auto size = std::filesystem::file_size(dir / "ckpt.h5");
  std::filesystem::resize_file(dir / "ckpt.h5", size / 2);
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "ckpt.h5", "cannot load checkpoint '", "ckpt.h5': HDF5 cannot open it (",
                              "it may be truncated or damaged)", "HDF5 error stack:", "H5Fopen():",
                              "truncated file: eof = ", "hint: a checkpoint cut short");
}

TEST(load_errors_test, a_file_that_is_not_hdf5_is_named) {
  ScratchDir dir;
  std::ofstream(dir / "notes.txt") << "step 10: loss 0.3\n";
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "notes.txt", "cannot load checkpoint '",
                              "notes.txt': it is not an HDF5 file (18 bytes, no HDF5 signature)");
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "absent.h5", "absent.h5': the file does not exist");
  EXPECT_LOAD_FAILS_UNTOUCHED(dir.path(), "it is not a regular file");
}

TEST(load_errors_test, an_hdf5_file_that_is_not_a_checkpoint_is_refused) {
  ScratchDir dir;
  const hid_t f = H5Fcreate((dir / "trace.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  H5Fclose(f);
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "trace.h5", "trace.h5': it is an HDF5 file but not an ampscope checkpoint");
}

TEST(load_errors_test, a_newer_format_version_is_refused_with_a_hint) {
  ScratchDir dir;
  LiveRun saved(1);
  save_checkpoint(dir / "ckpt.h5", saved.ck);
  const hid_t f = H5Fopen((dir / "ckpt.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const hid_t a = H5Aopen_by_name(f, "/", "format_version", H5P_DEFAULT, H5P_DEFAULT);
  const std::int64_t version = 2;
  ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT64, &version), 0);
  H5Aclose(a);
  H5Fclose(f);
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "ckpt.h5", "its format version is 2, but this build reads versions 1 to 1",
                              "hint: it was written by a newer ampscope");
}

TEST(load_errors_test, an_error_late_in_the_file_leaves_earlier_pieces_untouched_too) {
  // The model and optimizer fit; only the scaler state (read after them) does not. Nothing is applied.
  ScratchDir dir;
  LiveRun saved(1);
  saved.ck.states["scaler"].erase("scale");
  save_checkpoint(dir / "ckpt.h5", saved.ck);
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "ckpt.h5", "state 'scaler' lacks key 'scale'");
}

}  // namespace
}  // namespace ampscope
