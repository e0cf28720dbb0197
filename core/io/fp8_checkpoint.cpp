// The FP8 scaling state in checkpoints (core/io/fp8_checkpoint.h).
#include "core/io/fp8_checkpoint.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/io/checkpoint.h"

namespace ampscope {
namespace {

constexpr Fp8Operand kOperands[] = {Fp8Operand::input, Fp8Operand::weight, Fp8Operand::grad_output};

std::string recipe_name(Fp8Recipe r) {
  switch (r) {
    case Fp8Recipe::delayed: return "delayed";
    case Fp8Recipe::current: return "current";
    case Fp8Recipe::mxfp8: return "mxfp8";
    case Fp8Recipe::nvfp4: return "nvfp4";
  }
  return "?";
}
std::string mx_scale_name(MxScaleRule r) { return r == MxScaleRule::floor ? "floor" : "round-up"; }
std::string format_name(Fp8FormatMix f) { return f == Fp8FormatMix::hybrid ? "hybrid" : "e4m3"; }
std::string algo_name(AmaxAlgo a) { return a == AmaxAlgo::max ? "max" : "most_recent"; }

std::string module_key(std::size_t i) { return fmt::format("module.{}", i); }
std::string operand_key(std::size_t i, Fp8Operand o, const char* field) {
  return fmt::format("module.{}.{}.{}", i, fp8_operand_name(o), field);
}

Tensor f32_vector(const std::vector<float>& v) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(v.size())}, {DType::f32, Device::cpu()});
  if (!v.empty()) std::memcpy(t.data(), v.data(), v.size() * sizeof(float));
  return t;
}

// Reads the saved state's values by key, each of the type it must have.
class Reader {
 public:
  Reader(const StateDict& sd, const std::string& file) : sd_(sd), file_(file) {}

  const StateValue& at(const std::string& key) const {
    const auto it = sd_.find(key);
    if (it == sd_.end()) throw fail(key, "is missing");
    return it->second;
  }
  std::int64_t integer(const std::string& key) const {
    const StateValue& v = at(key);
    if (!std::holds_alternative<std::int64_t>(v)) throw fail(key, "is not an integer");
    return std::get<std::int64_t>(v);
  }
  double real(const std::string& key) const {
    const StateValue& v = at(key);
    if (!std::holds_alternative<double>(v)) throw fail(key, "is not a number");
    return std::get<double>(v);
  }
  const std::string& text(const std::string& key) const {
    const StateValue& v = at(key);
    if (!std::holds_alternative<std::string>(v)) throw fail(key, "is not a string");
    return std::get<std::string>(v);
  }
  // An f32 CPU vector of n elements.
  std::vector<float> floats(const std::string& key, std::int64_t n) const {
    const StateValue& v = at(key);
    if (!std::holds_alternative<Tensor>(v)) throw fail(key, "is not a tensor");
    const Tensor& t = std::get<Tensor>(v);
    if (t.dtype() != DType::f32 || t.dim() != 1 || t.numel() != n) {
      throw fail(key, fmt::format("is a {} tensor of shape {}, not f32 [{}]", dtype_name(t.dtype()), shape_str(t.shape()), n));
    }
    const Tensor c = t.to(Device::cpu()).contiguous();
    return std::vector<float>(c.data_as<float>(), c.data_as<float>() + n);
  }
  CheckpointError fail(const std::string& key, const std::string& what) const {
    return CheckpointError(fmt::format("--resume: '{}': the FP8 state's '{}' {}\nhint: the file is damaged or was not "
                                       "written by ampscope train --precision fp8; resume from another checkpoint or "
                                       "train from the start",
                                       file_, key, what));
  }

 private:
  const StateDict& sd_;
  const std::string& file_;
};

}  // namespace

StateDict fp8_state_dict(const Fp8Context& context) {
  const Fp8Options& o = context.options();
  StateDict sd{{"version", kFp8StateVersion},
               {"recipe", recipe_name(o.recipe)},
               {"format", format_name(o.formats)},
               {"amax_history", o.delayed.history_len},
               {"amax_algo", algo_name(o.delayed.algo)},
               {"margin", static_cast<double>(o.delayed.margin)}};
  // Current scaling keeps no state between steps (its context holds none).
  std::size_t i = 0;
  if (o.recipe == Fp8Recipe::delayed) {
    for (const auto& [module, state] : context.states()) {
      sd[module_key(i)] = module;
      for (Fp8Operand op : kOperands) {
        const DelayedScalingState& s = state.operand(op);
        sd[operand_key(i, op, "amax_history")] = f32_vector(s.amax_history);
        sd[operand_key(i, op, "scale")] = f32_vector({s.scale, s.scale_inv});
      }
      ++i;
    }
  }
  sd["modules"] = static_cast<std::int64_t>(i);
  return sd;
}

void load_fp8_state_dict(Fp8Context& context, const StateDict& saved, const std::vector<std::string>& module_paths,
                         const std::string& file) {
  const Reader r(saved, file);
  const std::int64_t version = r.integer("version");
  if (version != kFp8StateVersion) {
    throw CheckpointError(fmt::format("--resume: '{}' holds FP8 state of version {}; this build reads version {}\n"
                                      "hint: resume with the ampscope that wrote it, or train from the start",
                                      file, version, kFp8StateVersion));
  }
  const Fp8Options& o = context.options();
  // The settings the saved scales were made with: a run with other ones would not continue the saved run.
  const std::string saved_recipe = r.text("recipe"), saved_format = r.text("format"), saved_algo = r.text("amax_algo");
  const std::int64_t saved_history = r.integer("amax_history");
  const double saved_margin = r.real("margin");
  const bool delayed = o.recipe == Fp8Recipe::delayed;
  const bool same = saved_recipe == recipe_name(o.recipe) && saved_format == format_name(o.formats) &&
                    (!delayed || (saved_history == o.delayed.history_len && saved_algo == algo_name(o.delayed.algo) &&
                                  saved_margin == static_cast<double>(o.delayed.margin)));
  if (!same) {
    const auto describe = [](const std::string& recipe, const std::string& format, std::int64_t history,
                             const std::string& algo, double margin) {
      std::string s = fmt::format("--fp8-recipe {} --fp8-format {}", recipe, format);
      if (recipe == "delayed") s += fmt::format(" --fp8-amax-history {} --fp8-amax-algo {} --fp8-margin {}", history, algo, margin);
      return s;
    };
    throw CheckpointError(fmt::format(
        "--resume: '{}' was written by an FP8 run with {}, not {}: its scales would not continue under these "
        "settings\nhint: resume with the saved FP8 options, or train from the start with the new ones",
        file, describe(saved_recipe, saved_format, saved_history, saved_algo, saved_margin),
        describe(recipe_name(o.recipe), format_name(o.formats), o.delayed.history_len, algo_name(o.delayed.algo),
                 static_cast<double>(o.delayed.margin))));
  }
  const std::int64_t n = r.integer("modules");
  const std::int64_t most = delayed ? static_cast<std::int64_t>(module_paths.size()) : 0;
  if (n < 0 || n > most) {
    throw r.fail("modules", fmt::format("is {}; the model has {} module(s) that could hold FP8 state", n, most));
  }
  // Exactly the keys this version writes: 7, then 7 per module.
  const std::size_t expected = 7 + static_cast<std::size_t>(n) * 7;
  if (saved.size() != expected) {
    throw r.fail("modules", fmt::format("is {}, but the state holds {} keys, not the {} that makes", n, saved.size(), expected));
  }
  const std::set<std::string> known(module_paths.begin(), module_paths.end());
  std::map<std::string, Fp8LinearState> states;
  for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i) {
    const std::string& path = r.text(module_key(i));
    if (known.count(path) == 0) throw r.fail(module_key(i), fmt::format("names '{}', no module of this model", path));
    if (states.count(path) != 0) throw r.fail(module_key(i), fmt::format("names '{}' a second time", path));
    Fp8LinearState state;
    for (Fp8Operand op : kOperands) {
      DelayedScalingState& s = state.operand(op);
      const std::string hk = operand_key(i, op, "amax_history"), sk = operand_key(i, op, "scale");
      s.amax_history = r.floats(hk, o.delayed.history_len);
      for (float a : s.amax_history) {
        if (a < 0) throw r.fail(hk, fmt::format("holds a negative amax ({})", a));
      }
      const std::vector<float> scales = r.floats(sk, 2);
      s.scale = scales[0];
      s.scale_inv = scales[1];
      if (!std::isfinite(s.scale) || !(s.scale > 0) ||
          std::bit_cast<std::uint32_t>(s.scale_inv) != std::bit_cast<std::uint32_t>(1.0f / s.scale)) {
        throw r.fail(sk, fmt::format("is scale {} with scale_inv {}: a scale is finite and positive, scale_inv 1 / scale",
                                     s.scale, s.scale_inv));
      }
    }
    states.emplace(path, std::move(state));
  }
  for (auto& [path, state] : states) context.state(path) = std::move(state);
}

StateDict block_state_dict(const Fp8Context& context) {
  const Fp8Options& o = context.options();
  return StateDict{{"version", kBlockStateVersion},
                   {"recipe", recipe_name(o.recipe)},
                   {"mx_scale", mx_scale_name(o.mx_scale)},
                   {"rht", static_cast<std::int64_t>(o.nvfp4_rht ? 1 : 0)},
                   {"random_offset", static_cast<std::int64_t>(context.random_offset())}};
}

void load_block_state_dict(Fp8Context& context, const StateDict& saved, const std::string& file) {
  const Reader r(saved, file);
  const std::int64_t version = r.integer("version");
  if (version != kBlockStateVersion) {
    throw CheckpointError(fmt::format("--resume: '{}' holds block-scaled state of version {}; this build reads version "
                                      "{}\nhint: resume with the ampscope that wrote it, or train from the start",
                                      file, version, kBlockStateVersion));
  }
  const Fp8Options& o = context.options();
  const std::string& recipe = r.text("recipe");
  const std::string& mx_scale = r.text("mx_scale");
  const std::int64_t rht = r.integer("rht");
  if (rht != 0 && rht != 1) throw r.fail("rht", fmt::format("is {}, not 0 or 1", rht));
  const auto describe = [](const std::string& rec, const std::string& mx, bool with_rht) {
    if (rec == "mxfp8") return fmt::format("--precision mxfp8 --mx-scale {}", mx);
    if (rec == "nvfp4") return fmt::format("--precision nvfp4{}", with_rht ? "" : " --nvfp4-no-rht");
    return fmt::format("recipe '{}'", rec);
  };
  const bool mx = o.recipe == Fp8Recipe::mxfp8;
  const bool same = recipe == recipe_name(o.recipe) && (!mx || mx_scale == mx_scale_name(o.mx_scale)) &&
                    (mx || (rht == 1) == o.nvfp4_rht);
  if (!same) {
    throw CheckpointError(fmt::format("--resume: '{}' was written by a run with {}, not {}: it would not continue "
                                      "under these settings\nhint: resume with the saved options, or train from the "
                                      "start with the new ones",
                                      file, describe(recipe, mx_scale, rht == 1),
                                      describe(recipe_name(o.recipe), mx_scale_name(o.mx_scale), o.nvfp4_rht)));
  }
  const std::int64_t offset = r.integer("random_offset");
  if (offset < 0) throw r.fail("random_offset", fmt::format("is {}, below 0", offset));
  if (saved.size() != 5) throw r.fail("version", fmt::format("comes with {} keys, not the 5 this version writes", saved.size()));
  context.set_random_offset(static_cast<std::uint64_t>(offset));
}

}  // namespace ampscope
