// Every piece of a checkpoint comes back bit for bit: parameters of each float dtype (special values
// included), Adam and SGD state, group hyper-parameters after a scheduler, StateDicts of every value
// type, generators and the step; the file has the documented layout and types; saving is atomic.
#include <hdf5.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/io/checkpoint.h"
#include "core/optim.h"
#include "tests/checkpoint/checkpoint_test_support.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

using testing::bits;
using testing::make_small_net;
using testing::ScratchDir;
using testing::snapshot;
using testing::train_steps;

// Writes raw bit patterns into the first elements of a CPU tensor (the leaf's own storage, outside
// autograd), so values no arithmetic produces (NaN payloads, -0, the smallest subnormal) are saved too.
void poke_bits(const Tensor& t, const std::vector<std::uint64_t>& patterns) {
  auto* p = static_cast<unsigned char*>(t.data());
  const std::size_t size = dtype_size(t.dtype());
  for (std::size_t i = 0; i < patterns.size(); ++i) std::memcpy(p + i * size, &patterns[i], size);  // little-endian
}

// NaN with a payload, -0, the smallest subnormal, -inf, the largest finite value, for each width.
std::vector<std::uint64_t> special_patterns(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return {0x7FF8000000001234ull, 0x8000000000000000ull, 0x1ull, 0xFFF0000000000000ull, 0x7FEFFFFFFFFFFFFFull};
    case DType::f32: return {0x7FC01234u, 0x80000000u, 0x1u, 0xFF800000u, 0x7F7FFFFFu, 0x7F800001u /* signalling */};
    case DType::f16: return {0x7E12u, 0x8000u, 0x1u, 0xFC00u, 0x7BFFu, 0x7C01u /* signalling */};
    case DType::bf16: return {0x7FC3u, 0x8000u, 0x1u, 0xFF80u, 0x7F7Fu, 0x7F81u /* signalling */};
    default: return {};
  }
}

class float_dtype_round_trip_test : public ::testing::TestWithParam<DType> {};

TEST_P(float_dtype_round_trip_test, keeps_every_parameter_bit_including_nan_payloads_and_subnormals) {
  const DType dtype = GetParam();
  ScratchDir dir;
  Generator gen(1);
  auto saved = make_small_net(gen);
  saved.model->to(dtype);
  poke_bits(saved.model->named_parameters()[0].second, special_patterns(dtype));
  save_checkpoint(dir / "ckpt.h5", {.model = saved.model.get()});

  Generator other(99);
  auto loaded = make_small_net(other);
  loaded.model->to(dtype);
  const Tensor fc1_weight = loaded.model->named_parameters()[0].second;  // the handle an optimizer would hold
  ASSERT_NE(bits(fc1_weight), bits(saved.model->named_parameters()[0].second));
  Checkpoint into{.model = loaded.model.get()};
  // The patterns include NaN and Inf, which a load refuses unless told otherwise; allowed, it says so.
  EXPECT_THROW(load_checkpoint(dir / "ckpt.h5", into), CheckpointError);
  const CheckpointLoadReport report = load_checkpoint(dir / "ckpt.h5", into, {.allow_nonfinite = true});
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_NE(report.warnings[0].find("loaded although parameter 'fc1.weight'"), std::string::npos) << report.warnings[0];
  EXPECT_TRUE(report.checksums_verified);

  const auto want = saved.model->named_parameters(), got = loaded.model->named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_EQ(bits(got[i].second), bits(want[i].second)) << want[i].first;
    EXPECT_TRUE(got[i].second.requires_grad() && got[i].second.is_leaf()) << want[i].first;
  }
  // Loaded in place: the tensor an optimizer already holds sees the new values.
  EXPECT_EQ(fc1_weight.id(), loaded.model->named_parameters()[0].second.id());
  EXPECT_EQ(bits(fc1_weight), bits(want[0].second));
}

INSTANTIATE_TEST_SUITE_P(dtypes, float_dtype_round_trip_test,
                         ::testing::Values(DType::f32, DType::f16, DType::bf16, DType::f64),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

// Reads an attribute or dataset type's float fields with HDF5's own API, independently of checkpoint.cpp.
struct FloatFields {
  std::size_t size, spos, epos, esize, mpos, msize, ebias;
  bool operator==(const FloatFields&) const = default;
};

FloatFields dataset_float_fields(const std::filesystem::path& file, const char* dataset) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  EXPECT_GE(f, 0);
  const hid_t d = H5Dopen2(f, dataset, H5P_DEFAULT);
  EXPECT_GE(d, 0) << dataset;
  const hid_t t = H5Dget_type(d);
  FloatFields ff{};
  EXPECT_EQ(H5Tget_class(t), H5T_FLOAT) << dataset;
  ff.size = H5Tget_size(t);
  H5Tget_fields(t, &ff.spos, &ff.epos, &ff.esize, &ff.mpos, &ff.msize);
  ff.ebias = H5Tget_ebias(t);
  H5Tclose(t);
  H5Dclose(d);
  H5Fclose(f);
  return ff;
}

TEST(checkpoint_layout_test, stores_f16_and_bf16_as_16_bit_hdf5_floats_under_the_parameter_names) {
  ScratchDir dir;
  Generator gen(1);
  auto a = make_small_net(gen), b = make_small_net(gen);
  a.model->to(DType::f16);
  b.model->to(DType::bf16);
  optim::Adam opt(a.model->parameters());
  train_steps(*a.model, opt, 0, 1);
  save_checkpoint(dir / "f16.h5", {.model = a.model.get(), .optimizer = &opt});
  save_checkpoint(dir / "bf16.h5", {.model = b.model.get()});
  // IEEE binary16: sign 15, exponent 10..14 with bias 15, mantissa 0..9 (numpy float16 in h5py).
  EXPECT_EQ(dataset_float_fields(dir / "f16.h5", "/model/fc1.weight"), (FloatFields{2, 15, 10, 5, 0, 10, 15}));
  EXPECT_EQ(dataset_float_fields(dir / "f16.h5", "/optimizer/state/fc1.weight/exp_avg_sq"),
            (FloatFields{2, 15, 10, 5, 0, 10, 15}));
  // bfloat16: sign 15, exponent 7..14 with bias 127, mantissa 0..6.
  EXPECT_EQ(dataset_float_fields(dir / "bf16.h5", "/model/fc2.bias"), (FloatFields{2, 15, 7, 8, 0, 7, 127}));
}

TEST(checkpoint_layout_test, root_carries_format_name_version_and_step) {
  ScratchDir dir;
  save_checkpoint(dir / "ckpt.h5", {.step = 1234});
  const hid_t f = H5Fopen((dir / "ckpt.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  std::int64_t version = 0, step = 0;
  const hid_t v = H5Aopen_by_name(f, "/", "format_version", H5P_DEFAULT, H5P_DEFAULT);
  const hid_t s = H5Aopen_by_name(f, "/", "step", H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(v, 0);
  ASSERT_GE(s, 0);
  H5Aread(v, H5T_NATIVE_INT64, &version);
  H5Aread(s, H5T_NATIVE_INT64, &step);
  EXPECT_EQ(version, 2);
  EXPECT_EQ(step, 1234);
  EXPECT_GT(H5Aexists_by_name(f, "/", "format", H5P_DEFAULT), 0);
  H5Aclose(v);
  H5Aclose(s);
  H5Fclose(f);
}

TEST(optimizer_round_trip_test, adam_with_amsgrad_keeps_exp_avg_exp_avg_sq_max_and_step_counts) {
  ScratchDir dir;
  Generator gen(1);
  auto net = make_small_net(gen);
  optim::Adam opt(net.model->parameters(), {.lr = 3e-3, .betas = {{0.8, 0.95}}, .eps = 1e-6, .amsgrad = true,
                                            .weight_decay = 0.01});
  train_steps(*net.model, opt, 0, 3);
  Checkpoint saved{.model = net.model.get(), .optimizer = &opt};
  save_checkpoint(dir / "ckpt.h5", saved);

  Generator other(99);
  auto fresh = make_small_net(other);
  optim::Adam fresh_opt(fresh.model->parameters(), {.lr = 0.5});  // other hyper-parameters, no state
  Checkpoint into{.model = fresh.model.get(), .optimizer = &fresh_opt};
  load_checkpoint(dir / "ckpt.h5", into);

  EXPECT_EQ(snapshot(into), snapshot(saved));
  const optim::ParamState& s = fresh_opt.state(fresh.model->parameters()[0]);
  EXPECT_EQ(s.step, 3);
  EXPECT_TRUE(s.exp_avg.defined() && s.exp_avg_sq.defined() && s.max_exp_avg_sq.defined());
  EXPECT_FALSE(s.momentum_buffer.defined());
  EXPECT_EQ(fresh_opt.param_groups()[0].options.betas[1], 0.95);
  EXPECT_TRUE(fresh_opt.param_groups()[0].options.amsgrad);
}

TEST(optimizer_round_trip_test, sgd_keeps_momentum_buffers_and_per_group_hyper_parameters) {
  ScratchDir dir;
  Generator gen(1);
  auto net = make_small_net(gen);
  net.model->to(DType::f16);  // state is kept in the parameters' dtype
  const auto params = net.model->parameters();
  optim::SGD opt(std::vector<optim::ParamGroupSpec>{
      {.params = {params[0], params[1]}, .options = {.lr = 0.05, .momentum = 0.9, .nesterov = true}},
      {.params = {params[2], params[3]}, .options = {.lr = 0.01, .momentum = 0.5, .dampening = 0.1}}});
  train_steps(*net.model, opt, 0, 2);
  Checkpoint saved{.model = net.model.get(), .optimizer = &opt};
  save_checkpoint(dir / "ckpt.h5", saved);

  Generator other(99);
  auto fresh = make_small_net(other);
  fresh.model->to(DType::f16);
  const auto fp = fresh.model->parameters();
  optim::SGD fresh_opt(std::vector<optim::ParamGroupSpec>{{.params = {fp[0], fp[1]}, .options = {.momentum = 0.1}},
                                                          {.params = {fp[2], fp[3]}, .options = {.momentum = 0.1}}});
  Checkpoint into{.model = fresh.model.get(), .optimizer = &fresh_opt};
  load_checkpoint(dir / "ckpt.h5", into);

  EXPECT_EQ(snapshot(into), snapshot(saved));
  EXPECT_EQ(fresh_opt.state(fp[2]).momentum_buffer.dtype(), DType::f16);
  EXPECT_EQ(fresh_opt.param_groups()[1].options.dampening, 0.1);
  EXPECT_TRUE(fresh_opt.param_groups()[0].options.nesterov);
}

TEST(optimizer_round_trip_test, parameters_without_saved_state_lose_the_state_they_had) {
  ScratchDir dir;
  Generator gen(1);
  auto net = make_small_net(gen);
  optim::Adam opt(net.model->parameters());
  save_checkpoint(dir / "ckpt.h5", {.model = net.model.get(), .optimizer = &opt});  // before any step

  Generator other(99);
  auto fresh = make_small_net(other);
  optim::Adam fresh_opt(fresh.model->parameters());
  train_steps(*fresh.model, fresh_opt, 0, 1);
  Checkpoint into{.model = fresh.model.get(), .optimizer = &fresh_opt};
  load_checkpoint(dir / "ckpt.h5", into);
  for (const Tensor& p : fresh.model->parameters()) {
    const optim::ParamState* s = fresh_opt.find_state(p);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->step, 0) << p.name();
    EXPECT_FALSE(s->exp_avg.defined()) << p.name();
  }
}

TEST(optimizer_round_trip_test, lr_and_initial_lr_set_by_a_scheduler_come_back_and_the_schedule_resumes) {
  ScratchDir dir;
  Generator gen(1);
  auto net = make_small_net(gen);
  optim::SGD opt(net.model->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::StepLR sched(opt, /*step_size=*/2, /*gamma=*/0.5);
  train_steps(*net.model, opt, 0, 5, &sched);  // epoch 5: lr = 0.1 * 0.5^2
  ASSERT_EQ(opt.param_groups()[0].options.lr, 0.1 * 0.5 * 0.5);
  save_checkpoint(dir / "ckpt.h5", {.model = net.model.get(), .optimizer = &opt, .step = 5});

  Generator other(99);
  auto fresh = make_small_net(other);
  optim::SGD fresh_opt(fresh.model->parameters(), {.lr = 0.7});
  Checkpoint into{.model = fresh.model.get(), .optimizer = &fresh_opt};
  load_checkpoint(dir / "ckpt.h5", into);
  EXPECT_EQ(fresh_opt.param_groups()[0].options.lr, 0.025);
  ASSERT_TRUE(fresh_opt.param_groups()[0].initial_lr.has_value());
  EXPECT_EQ(*fresh_opt.param_groups()[0].initial_lr, 0.1);

  // A scheduler rebuilt at the saved epoch continues the original's sequence: 0.025 at epoch 5, then
  // 0.0125 at 6 and 7, 0.00625 at 8 (independent of the 0.7 the fresh optimizer was built with).
  optim::StepLR resumed(fresh_opt, 2, 0.5, /*last_epoch=*/into.step - 1);
  EXPECT_EQ(fresh_opt.param_groups()[0].options.lr, 0.025);
  const std::vector<double> expected = {0.0125, 0.0125, 0.00625};
  for (double want : expected) {
    resumed.step();
    sched.step();
    EXPECT_EQ(fresh_opt.param_groups()[0].options.lr, want);
    EXPECT_EQ(opt.param_groups()[0].options.lr, want);
  }
}

TEST(state_round_trip_test, doubles_ints_bools_strings_and_tensors_keep_their_type_and_bits) {
  ScratchDir dir;
  const StateDict run = {
      {"lr", 0.1},
      {"negative_zero", -0.0},
      {"nan", std::bit_cast<double>(0x7FF800000000BEEFull)},
      {"tiny", std::numeric_limits<double>::denorm_min()},
      {"inf", -std::numeric_limits<double>::infinity()},
      {"steps", std::int64_t{20}},
      {"most", std::numeric_limits<std::int64_t>::max()},
      {"least", std::numeric_limits<std::int64_t>::min()},
      {"amp", true},
      {"deterministic", false},
      {"model", std::string("tiny-transformer")},
      {"empty", std::string()},
      {"note", std::string("ünïcödé, quotes \" and\nnewlines")},
      {"f16_tensor", from_values({1.5, -0.0, 65504.0}, {3}, {.dtype = DType::f16})},
      {"i64_tensor", from_values({-3, 4, 5, 6}, {2, 2}, {.dtype = DType::i64})},
      {"bool_tensor", from_values({1, 0, 1}, {3}, {.dtype = DType::boolean})},
      {"scalar_tensor", from_values({2.5}, {}, {.dtype = DType::f64})},
      {"empty_tensor", zeros({0, 4})},
  };
  const StateDict scaler = {{"scale", 65536.0},        {"growth_factor", 2.0},       {"backoff_factor", 0.5},
                            {"growth_interval", std::int64_t{2000}}, {"_growth_tracker", std::int64_t{17}}};
  save_checkpoint(dir / "ckpt.h5", {.states = {{"run", run}, {"scaler", scaler}}});

  // "run" with an empty template (any keys); "scaler" against the keys and types a scaler expects.
  const StateDict scaler_template = {{"scale", 1.0},
                                     {"growth_factor", 1.0},
                                     {"backoff_factor", 1.0},
                                     {"growth_interval", std::int64_t{0}},
                                     {"_growth_tracker", std::int64_t{0}}};
  Checkpoint into{.states = {{"run", {}}, {"scaler", scaler_template}}};
  load_checkpoint(dir / "ckpt.h5", into);
  EXPECT_EQ(bits(into.states.at("run")), bits(run));
  EXPECT_EQ(bits(into.states.at("scaler")), bits(scaler));
  EXPECT_EQ(std::get<std::int64_t>(into.states.at("scaler").at("_growth_tracker")), 17);
  EXPECT_EQ(std::get<Tensor>(into.states.at("run").at("scalar_tensor")).dim(), 0);
}

TEST(generator_round_trip_test, seed_and_offset_of_each_named_generator_come_back) {
  ScratchDir dir;
  Generator init(std::numeric_limits<std::uint64_t>::max()), dropout(5);
  init.set_offset(std::uint64_t{1} << 63);
  (void)rand({1000}, dropout);  // 250 Philox blocks
  ASSERT_EQ(dropout.offset(), 250u);
  save_checkpoint(dir / "ckpt.h5", {.generators = {{"init", &init}, {"dropout", &dropout}}, .step = 42});

  Generator a(0), b(0);
  Checkpoint into{.generators = {{"init", &a}, {"dropout", &b}}};
  load_checkpoint(dir / "ckpt.h5", into);
  EXPECT_EQ(a.seed(), std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(a.offset(), std::uint64_t{1} << 63);
  EXPECT_EQ(b.seed(), 5u);
  EXPECT_EQ(b.offset(), 250u);
  EXPECT_EQ(into.step, 42);
  // The restored stream draws what the original draws next.
  EXPECT_EQ(bits(rand({16}, b)), bits(rand({16}, dropout)));
}

TEST(device_round_trip_test, parameters_on_the_gpu_are_saved_and_loaded_through_host_memory) {
  SKIP_WITHOUT_GPU();
  ScratchDir dir;
  Generator gen(1);
  auto on_gpu = make_small_net(gen);
  on_gpu.model->to(DType::f16);
  const std::string host_bits = bits(on_gpu.model->parameters()[0]);
  on_gpu.model->to(Device::cuda());
  save_checkpoint(dir / "ckpt.h5", {.model = on_gpu.model.get()});

  Generator other(99);
  auto on_cpu = make_small_net(other), back_on_gpu = make_small_net(other);
  on_cpu.model->to(DType::f16);
  back_on_gpu.model->to(DType::f16).to(Device::cuda());
  Checkpoint into_cpu{.model = on_cpu.model.get()}, into_gpu{.model = back_on_gpu.model.get()};
  load_checkpoint(dir / "ckpt.h5", into_cpu);
  load_checkpoint(dir / "ckpt.h5", into_gpu);
  EXPECT_EQ(bits(on_cpu.model->parameters()[0]), host_bits);
  EXPECT_TRUE(back_on_gpu.model->parameters()[0].device().is_cuda());
  EXPECT_EQ(snapshot(into_gpu).model, snapshot({.model = on_gpu.model.get()}).model);
}

TEST(checkpoint_pieces_test, pieces_left_out_of_a_load_are_neither_read_nor_changed) {
  ScratchDir dir;
  Generator gen(1);
  auto net = make_small_net(gen);
  save_checkpoint(dir / "ckpt.h5", {.model = net.model.get(), .generators = {{"g", &gen}}, .step = 7});
  Generator other(99);
  auto fresh = make_small_net(other);  // a different shape would not matter either: the model is not asked for
  Generator g(3);
  Checkpoint into{.generators = {{"g", &g}}};
  const std::string before = bits(fresh.model->parameters()[0]);
  load_checkpoint(dir / "ckpt.h5", into);
  EXPECT_EQ(bits(fresh.model->parameters()[0]), before);
  EXPECT_EQ(g.seed(), 1u);
  EXPECT_EQ(into.step, 7);
}

TEST(checkpoint_layout_test, every_hdf5_handle_is_closed_after_a_save_a_load_and_a_failed_load) {
  ScratchDir dir;
  Generator gen(1);
  auto net = make_small_net(gen);
  optim::Adam opt(net.model->parameters());
  train_steps(*net.model, opt, 0, 1);
  Checkpoint ck{.model = net.model.get(), .optimizer = &opt, .generators = {{"g", &gen}},
                .states = {{"run", {{"lr", 0.1}, {"name", std::string("x")}}}}};
  save_checkpoint(dir / "ckpt.h5", ck);
  EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 0);
  load_checkpoint(dir / "ckpt.h5", ck);
  EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 0);
  ck.states["run"] = {{"lr", 0.1}, {"missing", true}};
  EXPECT_THROW(load_checkpoint(dir / "ckpt.h5", ck), CheckpointError);
  EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 0);
}

TEST(atomic_save_test, a_second_save_replaces_the_file_and_leaves_no_temporary_behind) {
  ScratchDir dir;
  save_checkpoint(dir / "ckpt.h5", {.step = 1});
  save_checkpoint(dir / "ckpt.h5", {.step = 2});
  Checkpoint into;
  load_checkpoint(dir / "ckpt.h5", into);
  EXPECT_EQ(into.step, 2);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"ckpt.h5"});
}

TEST(atomic_save_test, a_save_that_fails_midway_leaves_the_previous_checkpoint_intact) {
  ScratchDir dir;
  Generator gen(1);
  auto net = make_small_net(gen);
  save_checkpoint(dir / "ckpt.h5", {.model = net.model.get(), .step = 1});
  const auto size = std::filesystem::file_size(dir / "ckpt.h5");
  // The model is written first, then the state whose key cannot be a link name stops the save.
  EXPECT_THROW_MSG(save_checkpoint(dir / "ckpt.h5", {.model = net.model.get(), .states = {{"run", {{"a/b", 1.0}}}},
                                                     .step = 2}),
                   CheckpointError, "cannot save checkpoint '", "ckpt.h5", "state 'run' key name 'a/b'",
                   "contain no '/'");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"ckpt.h5"});
  EXPECT_EQ(std::filesystem::file_size(dir / "ckpt.h5"), size);
  Checkpoint into;
  load_checkpoint(dir / "ckpt.h5", into);
  EXPECT_EQ(into.step, 1);
}

TEST(atomic_save_test, saving_into_a_missing_directory_names_it) {
  ScratchDir dir;
  EXPECT_THROW_MSG(save_checkpoint(dir / "missing" / "ckpt.h5", {}), CheckpointError, "cannot save checkpoint '",
                   "missing/ckpt.h5'", "directory '", "missing' does not exist");
}

TEST(atomic_save_test, unnamed_optimizer_parameters_are_refused_with_a_hint) {
  ScratchDir dir;
  Tensor w = zeros({2});
  w.requires_grad_();
  optim::SGD opt({w});
  EXPECT_THROW_MSG(save_checkpoint(dir / "ckpt.h5", {.optimizer = &opt}), CheckpointError,
                   "SGD parameter 0 of group 0 has no name", "hint: register the tensor in an nn::Module");
  EXPECT_TRUE(dir.entries().empty());
}

}  // namespace
}  // namespace ampscope
