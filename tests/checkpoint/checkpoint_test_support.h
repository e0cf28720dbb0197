// tests/checkpoint/checkpoint_test_support.h: what the checkpoint tests share: a scratch directory per
// test, exact-bit views of tensors and of everything a checkpoint restores, and a small model with a
// dropout layer that records its masks.
//
//   ScratchDir dir;
//   save_checkpoint(dir / "ckpt.h5", ck);
//   const Snapshot before = snapshot(ck);   // ... a failing load_checkpoint ...   EXPECT_EQ(snapshot(ck), before);
#pragma once

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <fstream>
#include <iterator>

#include "core/io/checkpoint.h"
#include "core/nn.h"
#include "core/ops.h"
#include "core/optim.h"
#include "samples/synthetic.h"

namespace ampscope::testing {

// Recomputes the whole-file checksum of a checkpoint that a test edited on purpose (core/io/checkpoint.cpp: a
// 512-byte user block holding a 32-byte magic, the byte count after the block as u64 LE and zlib's CRC-32
// of those bytes as u32 LE), so that the edit reaches the load's inner checks instead of this outer one.
inline void reseal_checkpoint(const std::filesystem::path& path) {
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_GT(bytes.size(), 512u);
  const std::uint64_t rest = bytes.size() - 512;
  const auto crc = static_cast<std::uint32_t>(
      ::crc32(::crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data() + 512), static_cast<uInt>(rest)));
  for (int i = 0; i < 8; ++i) bytes[32 + i] = static_cast<char>(rest >> (8 * i));
  for (int i = 0; i < 4; ++i) bytes[40 + i] = static_cast<char>(crc >> (8 * i));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A fresh directory for the running test (unique per process and test), removed afterwards.
class ScratchDir {
 public:
  ScratchDir() {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = fmt::format("ampscope-ckpt-{}-{}-{}", ::getpid(), info->test_suite_name(), info->name());
    std::replace(name.begin(), name.end(), '/', '_');  // parameterised tests are named "suite/test/param"
    path_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(std::string_view name) const { return path_ / name; }
  // Every entry's file name, sorted (to see that no temporary file was left behind).
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::filesystem::path path_;
};

// A tensor's dtype, shape and raw bytes: equal exactly when the tensors are equal bit for bit.
inline std::string bits(const Tensor& t) {
  if (!t.defined()) return "undefined";
  const Tensor host = t.detach().to(Device::cpu()).contiguous();
  const auto* p = static_cast<const unsigned char*>(host.data());
  std::string text = fmt::format("{} {} ", dtype_name(host.dtype()), shape_str(host.shape()));
  for (std::int64_t i = 0; i < host.numel() * static_cast<std::int64_t>(dtype_size(host.dtype())); ++i) {
    text += fmt::format("{:02x}", p[i]);
  }
  return text;
}

// A StateValue with its type and exact bits ("f64 0x3fb999999999999a" for 0.1).
inline std::string bits(const StateValue& v) {
  switch (v.index()) {
    case 0: return fmt::format("f64 {:#x}", std::bit_cast<std::uint64_t>(std::get<double>(v)));
    case 1: return fmt::format("i64 {}", std::get<std::int64_t>(v));
    case 2: return fmt::format("bool {}", std::get<bool>(v));
    case 3: return fmt::format("string '{}'", std::get<std::string>(v));
    default: return "tensor " + bits(std::get<Tensor>(v));
  }
}

inline std::map<std::string, std::string> bits(const StateDict& sd) {
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : sd) out[k] = bits(v);
  return out;
}

inline std::string bits(const optim::Hyperparameters& h, const std::optional<double>& initial_lr) {
  auto b = [](double x) { return std::bit_cast<std::uint64_t>(x); };
  return fmt::format("lr {:#x} momentum {:#x} dampening {:#x} nesterov {} betas {:#x} {:#x} eps {:#x} amsgrad {} "
                     "weight_decay {:#x} maximize {} initial_lr {}",
                     b(h.lr), b(h.momentum), b(h.dampening), h.nesterov, b(h.betas[0]), b(h.betas[1]), b(h.eps),
                     h.amsgrad, b(h.weight_decay), h.maximize,
                     initial_lr ? fmt::format("{:#x}", b(*initial_lr)) : std::string("none"));
}

inline std::string bits(const optim::ParamState* s) {
  if (s == nullptr) return "no state";
  return fmt::format("step {} momentum_buffer {} exp_avg {} exp_avg_sq {} max_exp_avg_sq {}", s->step,
                     bits(s->momentum_buffer), bits(s->exp_avg), bits(s->exp_avg_sq), bits(s->max_exp_avg_sq));
}

// Everything a checkpoint can restore, as exact bits, for comparing before and after a load.
struct Snapshot {
  std::map<std::string, std::string> model;      // name -> bits
  std::vector<std::string> groups;               // each group's hyper-parameters
  std::map<std::string, std::string> opt_state;  // parameter name -> state
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> generators;
  std::map<std::string, std::map<std::string, std::string>> states;
  std::int64_t step = 0;
  bool operator==(const Snapshot&) const = default;
};

inline Snapshot snapshot(const Checkpoint& ck) {
  Snapshot s;
  if (ck.model != nullptr) {
    for (const auto& [name, t] : ck.model->named_parameters()) s.model[name] = bits(t);
    for (const auto& [name, t] : ck.model->named_buffers()) s.model[name] = bits(t);
  }
  if (ck.optimizer != nullptr) {
    for (const optim::ParamGroup& g : ck.optimizer->param_groups()) {
      s.groups.push_back(bits(g.options, g.initial_lr));
      for (const Tensor& p : g.params) s.opt_state[p.name()] = bits(ck.optimizer->find_state(p));
    }
  }
  for (const auto& [name, gen] : ck.generators) s.generators[name] = {gen->seed(), gen->offset()};
  for (const auto& [name, sd] : ck.states) s.states[name] = bits(sd);
  s.step = ck.step;
  return s;
}

// Dropout that keeps, for each call, the mask it applied: per element 1 (kept), 0 (dropped), or 2 where
// the input was already 0 and the mask cannot be seen.
class RecordingDropout : public nn::Module {
 public:
  RecordingDropout(double p, Generator& gen) : nn::Module("RecordingDropout") {
    dropout_ = register_module("dropout", std::make_shared<nn::Dropout>(p, gen));
  }
  std::vector<std::vector<std::int64_t>> masks;

 protected:
  Tensor forward(const Tensor& x) override {
    Tensor y = (*dropout_)(x);
    if (is_training()) {
      const std::vector<double> in = x.values(), out = y.values();
      std::vector<std::int64_t> mask(in.size());
      for (std::size_t i = 0; i < in.size(); ++i) mask[i] = in[i] == 0.0 ? 2 : (out[i] != 0.0 ? 1 : 0);
      masks.push_back(std::move(mask));
    }
    return y;
  }

 private:
  std::shared_ptr<nn::Dropout> dropout_;
};

// fc1 (8 -> hidden), relu, drop (p = 0.25), fc2 (hidden -> 3); fc2 without bias when asked.
struct SmallNet {
  std::shared_ptr<nn::Sequential> model;
  std::shared_ptr<RecordingDropout> drop;
};

inline SmallNet make_small_net(Generator& gen, std::int64_t hidden = 16, bool fc2_bias = true) {
  SmallNet net;
  net.model = std::make_shared<nn::Sequential>();
  net.model->register_module("fc1", std::make_shared<nn::Linear>(8, hidden, gen));
  net.model->register_module("relu", std::make_shared<nn::ReLU>());
  net.drop = net.model->register_module("drop", std::make_shared<RecordingDropout>(0.25, gen));
  net.model->register_module("fc2", std::make_shared<nn::Linear>(hidden, 3, gen, fc2_bias));
  return net;
}

// 64 points of 3 classes in 8 dimensions, the same in every process.
inline const samples::Dataset& small_data() {
  static const samples::Dataset data = [] {
    Generator data_gen(7);
    return samples::make_blobs({.samples = 64, .features = 8, .classes = 3}, data_gen);
  }();
  return data;
}

// Training steps [from, to) on mini-batches of 16 chosen by the step number, so a resumed run sees the
// batches the uninterrupted one saw. Steps the scheduler after each step when there is one.
inline void train_steps(nn::Module& model, optim::Optimizer& opt, int from, int to,
                        optim::LRScheduler* sched = nullptr) {
  const samples::Dataset& data = small_data();
  for (int step = from; step < to; ++step) {
    const std::int64_t b = (step % 4) * 16;
    const DType dtype = model.named_parameters().front().second.dtype();
    Tensor loss = cross_entropy(model(data.x.slice(0, b, b + 16).to(dtype)), data.y.slice(0, b, b + 16));
    opt.zero_grad();
    loss.backward();
    opt.step();
    if (sched != nullptr) sched->step();
  }
}

}  // namespace ampscope::testing
