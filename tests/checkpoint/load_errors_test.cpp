// A checkpoint that does not fit, or is not a checkpoint at all, raises a CheckpointError that names the
// file and what is wrong, and leaves the model, optimizer, generators, StateDicts and step exactly as
// they were (compared bit for bit before and after the failed load).
#include <hdf5.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/autograd.h"
#include "core/io/checkpoint.h"
#include "core/ops.h"
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
  testing::reseal_checkpoint(dir / "ckpt.h5");  // past the whole-file checksum, to the check under test
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

TEST(load_errors_test, a_truncated_file_is_refused_with_both_sizes) {
  ScratchDir dir;
  LiveRun saved(1);
  save_checkpoint(dir / "ckpt.h5", saved.ck);
  const auto size = std::filesystem::file_size(dir / "ckpt.h5");
  std::filesystem::resize_file(dir / "ckpt.h5", size / 2);
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "ckpt.h5", "cannot load checkpoint '",
                              fmt::format("ckpt.h5': it holds {} bytes after its checksum block, but was saved with {}: it "
                                          "was cut short",
                                          size / 2 - 512, size - 512),
                              "hint: a checkpoint cut short");
}

TEST(load_errors_test, a_file_that_is_not_hdf5_is_named) {
  ScratchDir dir;
  std::ofstream(dir / "notes.txt") << "step 10: loss 0.3\n";
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "notes.txt", "cannot load checkpoint '",
                              "notes.txt': it is not an HDF5 file (18 bytes, no HDF5 signature)");
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "absent.h5", "absent.h5': it does not exist");
  EXPECT_LOAD_FAILS_UNTOUCHED(dir.path(), "it is a directory, not a regular file");
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
  const std::int64_t version = 3;
  ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT64, &version), 0);
  H5Aclose(a);
  H5Fclose(f);
  testing::reseal_checkpoint(dir / "ckpt.h5");  // past the whole-file checksum, to the check under test
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "ckpt.h5", "its format version is 3, but this build reads versions 1 to 2",
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

// ---- integrity: checksums, NaN/Inf, stale temporaries, disk full -------------------------------------

std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Every dataset of a file with the file offset and size of its (contiguous) data, found with HDF5's own
// API, independently of checkpoint.cpp.
std::vector<std::tuple<std::string, haddr_t, hsize_t>> dataset_regions(const std::filesystem::path& path) {
  std::vector<std::tuple<std::string, haddr_t, hsize_t>> regions;
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  EXPECT_GE(f, 0);
  auto visit = [](hid_t root, const char* name, const H5O_info_t* info, void* data) -> herr_t {
    if (info->type != H5O_TYPE_DATASET) return 0;
    const hid_t d = H5Dopen2(root, name, H5P_DEFAULT);
    static_cast<std::vector<std::tuple<std::string, haddr_t, hsize_t>>*>(data)->emplace_back(
        std::string("/") + name, H5Dget_offset(d), H5Dget_storage_size(d));  // absolute: past the user block
    H5Dclose(d);
    return 0;
  };
  H5Ovisit(f, H5_INDEX_NAME, H5_ITER_INC, visit, &regions);
  H5Fclose(f);
  return regions;
}

TEST(checkpoint_integrity_test, a_byte_changed_inside_any_stored_tensor_is_refused_naming_it) {
  ScratchDir dir;
  LiveRun saved(1);
  save_checkpoint(dir / "ckpt.h5", saved.ck);
  const std::string good = read_bytes(dir / "ckpt.h5");
  const auto regions = dataset_regions(dir / "ckpt.h5");
  // Model tensors, Adam's exp_avg/exp_avg_sq of each parameter, and the group's parameter-name list.
  ASSERT_GE(regions.size(), 13u);
  for (const auto& [name, offset, size] : regions) {
    SCOPED_TRACE(name);
    ASSERT_NE(offset, HADDR_UNDEF);
    ASSERT_GT(size, 0u);
    std::string bad = good;
    bad[offset + size / 2] ^= 0x10;
    write_bytes(dir / "bad.h5", bad);
    testing::reseal_checkpoint(dir / "bad.h5");  // past the whole-file checksum, to the per-tensor one
    EXPECT_LOAD_FAILS_UNTOUCHED(dir / "bad.h5", fmt::format("'{}' does not match its checksum", name),
                                "the file was changed after it was saved", "hint: a damaged checkpoint cannot be trusted");
  }
  write_bytes(dir / "bad.h5", good);  // the same bytes unchanged load
  LiveRun live(2);
  EXPECT_TRUE(load_checkpoint(dir / "bad.h5", live.ck).checksums_verified);
}

// Flips one byte of the one place `value`'s bytes occur in the file.
void flip_unique(const std::filesystem::path& path, const void* value, std::size_t size) {
  std::string bytes = read_bytes(path);
  const std::string needle(static_cast<const char*>(value), size);
  const std::size_t at = bytes.find(needle);
  ASSERT_NE(at, std::string::npos);
  ASSERT_EQ(bytes.find(needle, at + 1), std::string::npos) << "the value occurs twice";
  bytes[at + size - 1] ^= 0x01;
  write_bytes(path, bytes);
}

TEST(checkpoint_integrity_test, a_byte_changed_in_a_saved_value_is_refused_naming_the_value) {
  ScratchDir dir;
  LiveRun saved(1);
  saved.ck.states["run"] = StateDict{{"ratio", 0.123456789012345}, {"label", std::string("a-unique-label-xyz")},
                                     {"count", std::int64_t{0x0123456789abcd}}, {"flag", true}};
  saved.ck.step = 987654321987;
  save_checkpoint(dir / "ckpt.h5", saved.ck);
  const std::string good = read_bytes(dir / "ckpt.h5");
  const double ratio = 0.123456789012345;
  const std::int64_t count = 0x0123456789abcd, step = 987654321987;
  const std::string label = "a-unique-label-xyz";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {std::string(reinterpret_cast<const char*>(&ratio), 8), "'/states/run@ratio' does not match its checksum"},
      {std::string(reinterpret_cast<const char*>(&count), 8), "'/states/run@count' does not match its checksum"},
      {label, "'/states/run@label' does not match its checksum"},
      {std::string(reinterpret_cast<const char*>(&step), 8), "'/@step' does not match its checksum"}};
  for (const auto& [value, message] : cases) {
    SCOPED_TRACE(message);
    write_bytes(dir / "bad.h5", good);
    flip_unique(dir / "bad.h5", value.data(), value.size());
    testing::reseal_checkpoint(dir / "bad.h5");  // past the whole-file checksum, to the per-value one
    LiveRun live(2);
    live.ck.states["run"] = StateDict{};
    const testing::Snapshot before = snapshot(live.ck);
    EXPECT_THROW_MSG(load_checkpoint(dir / "bad.h5", live.ck), CheckpointError, message);
    EXPECT_TRUE(snapshot(live.ck) == before);
  }
}

// The whole-file checksum (the user block) is checked before HDF5 parses anything: a byte changed anywhere
// after the block, HDF5's own metadata included (which HDF5 1.10 does not checksum, and which crashed
// H5Fclose in trace_fuzz_test), is refused; so is a damaged block.
TEST(checkpoint_integrity_test, a_byte_changed_anywhere_is_refused_before_hdf5_reads_the_file) {
  ScratchDir dir;
  LiveRun saved(1);
  save_checkpoint(dir / "ckpt.h5", saved.ck);
  const std::string good = read_bytes(dir / "ckpt.h5");
  ASSERT_GT(good.size(), 2048u);
  for (const std::size_t at : {std::size_t{512}, std::size_t{600}, std::size_t{1000}, good.size() / 2, good.size() - 1}) {
    SCOPED_TRACE(at);
    std::string bad = good;
    bad[at] ^= 0x04;
    write_bytes(dir / "bad.h5", bad);
    EXPECT_LOAD_FAILS_UNTOUCHED(dir / "bad.h5", "its bytes do not match the file checksum", "hint: a damaged checkpoint");
  }
  std::string bad = good;
  bad[3] ^= 0x01;  // the block's magic
  write_bytes(dir / "bad.h5", bad);
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "bad.h5", "its checksum block (the first 512 bytes) is damaged");
}

TEST(checkpoint_integrity_test, a_version_2_file_edited_to_claim_version_1_is_still_verified) {
  ScratchDir dir;
  LiveRun saved(1);
  save_checkpoint(dir / "ckpt.h5", saved.ck);
  const hid_t f = H5Fopen((dir / "ckpt.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const hid_t a = H5Aopen_by_name(f, "/", "format_version", H5P_DEFAULT, H5P_DEFAULT);
  const std::int64_t version = 1;
  ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT64, &version), 0);
  H5Aclose(a);
  H5Fclose(f);
  testing::reseal_checkpoint(dir / "ckpt.h5");  // past the whole-file checksum, to the check under test
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "ckpt.h5", "'/@format_version' does not match its checksum");
}

TEST(checkpoint_integrity_test, nan_or_inf_in_a_parameter_or_optimizer_state_is_refused_by_name_unless_allowed) {
  ScratchDir dir;
  {
    LiveRun saved(1);
    NoGradGuard no_grad;
    Tensor w = saved.net.model->named_parameters()[2].second;  // fc2.weight
    ASSERT_EQ(saved.net.model->named_parameters()[2].first, "fc2.weight");
    w.copy_(mul(w, std::nan("")));
    save_checkpoint(dir / "nan-param.h5", saved.ck);
  }
  {
    LiveRun saved(1);
    NoGradGuard no_grad;
    const Tensor p = saved.net.model->named_parameters()[0].second;  // fc1.weight
    optim::ParamState& st = saved.opt->state(p);
    st.exp_avg_sq = mul(st.exp_avg_sq, std::numeric_limits<double>::infinity());
    save_checkpoint(dir / "inf-state.h5", saved.ck);
  }
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "nan-param.h5", "parameter 'fc2.weight' ('/model/fc2.weight') holds ", " NaN and 0 Inf",
                              "hint: the run had diverged when it saved", "allow_nonfinite");
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "inf-state.h5",
                              "optimizer state exp_avg_sq of 'fc1.weight' ('/optimizer/state/fc1.weight/exp_avg_sq') "
                              "holds ", " Inf of its 128 values");
  for (const char* file : {"nan-param.h5", "inf-state.h5"}) {
    LiveRun live(2);
    const CheckpointLoadReport report = load_checkpoint(dir / file, live.ck, {.allow_nonfinite = true});
    ASSERT_EQ(report.warnings.size(), 1u) << file;
    EXPECT_NE(report.warnings[0].find("loaded although "), std::string::npos) << report.warnings[0];
  }
  LiveRun live(2);
  load_checkpoint(dir / "nan-param.h5", live.ck, {.allow_nonfinite = true});
  const Tensor loaded = live.net.model->named_parameters()[2].second.to(DType::f64).contiguous();
  EXPECT_TRUE(std::isnan(static_cast<const double*>(loaded.data())[0]));
}

TEST(checkpoint_integrity_test, a_save_removes_temporaries_of_dead_processes_and_keeps_those_of_live_ones) {
  ScratchDir dir;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);  // reaped: the PID names no process now
  const std::string dead = fmt::format(".ckpt.h5.tmp-{}-7", child);
  const std::string live = ".ckpt.h5.tmp-1-3";                       // PID 1 is always alive
  const std::string other = fmt::format(".other.h5.tmp-{}-7", child);  // another target's
  const std::string odd = ".ckpt.h5.tmp-notes";                      // not a name we write
  for (const std::string& name : {dead, live, other, odd}) write_bytes(dir / name, "half a checkpoint");
  LiveRun saved(1);
  save_checkpoint(dir / "ckpt.h5", saved.ck);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{live, odd, other, "ckpt.h5"}));
}

// Runs `body` in a child process that must end by exit() (so HDF5's clean-up at exit runs) with status 0.
template <class Body>
void in_child(Body body) {
  std::fflush(nullptr);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) std::exit(body());
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(checkpoint_integrity_test, a_full_disk_fails_the_save_cleanly_and_keeps_the_previous_checkpoint) {
  // RLIMIT_FSIZE makes write() fail (EFBIG) as a full disk does (ENOSPC): same path, no mount needed.
  ScratchDir dir;
  LiveRun saved(1);
  saved.ck.step = 5;
  save_checkpoint(dir / "ckpt.h5", saved.ck);
  const std::string previous = read_bytes(dir / "ckpt.h5");
  in_child([&] {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{1024, 1024};
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) return 10;
    saved.ck.step = 6;
    try {
      save_checkpoint(dir / "ckpt.h5", saved.ck);
      return 11;  // it should have failed
    } catch (const CheckpointError& e) {
      const std::string what = e.what();
      if (what.find("writing '") == std::string::npos || what.find(std::strerror(EFBIG)) == std::string::npos) {
        std::fprintf(stderr, "unexpected message: %s\n", what.c_str());
        return 12;
      }
    }
    if (H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL) != 0) return 13;  // nothing left open in HDF5
    return 0;                                                         // exit() runs HDF5's clean-up
  });
  EXPECT_EQ(read_bytes(dir / "ckpt.h5"), previous);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"ckpt.h5"});  // the temporary is gone
  LiveRun live(2);
  load_checkpoint(dir / "ckpt.h5", live.ck);
  EXPECT_EQ(live.ck.step, 5);
}

TEST(checkpoint_integrity_test, a_fifo_is_refused_at_once_instead_of_blocking) {
  ScratchDir dir;
  ASSERT_EQ(mkfifo((dir / "pipe.h5").c_str(), 0600), 0);
  EXPECT_LOAD_FAILS_UNTOUCHED(dir / "pipe.h5", "pipe.h5': it is a FIFO (named pipe), not a regular file");
}

}  // namespace
}  // namespace ampscope
