// Hugging Face model folders: config parsing, the weight sources, the shared layers, load_model,
// make_model and save_model. The architectures are in hf_gpt2.cpp and hf_llama.cpp.
#include "models/hf_models.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "core/io/input_file.h"
#include "core/io/json_limits.h"
#include "core/io/output_file.h"
#include "core/io/safetensors.h"

namespace ampscope::samples::hf {

namespace detail {

namespace {

std::string json_kind(const nlohmann::json& v) {
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number_float()) return "a number";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

// A value for a message: its compact JSON, cut to 60 characters (never printed whole: it may be large, or
// nested as deep as the parser allows).
std::string shown(const nlohmann::json& v) { return ampscope::detail::json_excerpt(v, 60); }

}  // namespace

Config::Config(const nlohmann::json& json, std::string where) : json_(json), where_(std::move(where)) {
  if (!json_.is_object()) {
    throw ModelError(fmt::format("{}: the config must be a JSON object, got {}\nhint: config.json is the file "
                                 "Hugging Face's save_pretrained writes beside the weights",
                                 where_, json_kind(json_)));
  }
}

bool Config::has(const std::string& key) const { return json_.contains(key) && !json_.at(key).is_null(); }

void Config::refuse(const std::string& key, const std::string& why, const std::string& hint) const {
  throw ModelError(fmt::format("{}: key '{}' {}\nhint: {}", where_, key, why, hint));
}

std::int64_t Config::positive_int(const std::string& key) const {
  if (!has(key)) {
    refuse(key, "is missing (or null); ampscope needs it to build the model",
           fmt::format("add \"{}\" to the config; the folder's model card or the original config.json has it", key));
  }
  const auto v = optional_int(key);
  if (*v <= 0) refuse(key, fmt::format("must be a positive integer, got {}", *v), "fix the value in config.json");
  return *v;
}

std::int64_t Config::positive_int(const std::string& key, std::int64_t fallback) const {
  if (!has(key)) return fallback;
  return positive_int(key);
}

std::optional<std::int64_t> Config::optional_int(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  const nlohmann::json& v = json_.at(key);
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (v.is_number_unsigned() && v.get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX)) {
    return static_cast<std::int64_t>(v.get<std::uint64_t>());
  }
  refuse(key, fmt::format("must be an integer, got {} ({})", shown(v), json_kind(v)),
         fmt::format("write it as a plain JSON integer, e.g. \"{}\": 4", key));
}

double Config::number(const std::string& key, double fallback) const {
  if (!has(key)) return fallback;
  const nlohmann::json& v = json_.at(key);
  if (!v.is_number()) {
    refuse(key, fmt::format("must be a number, got {} ({})", shown(v), json_kind(v)),
           fmt::format("write it as a JSON number, e.g. \"{}\": 1e-05", key));
  }
  return v.get<double>();
}

bool Config::boolean(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const nlohmann::json& v = json_.at(key);
  if (!v.is_boolean()) {
    refuse(key, fmt::format("must be true or false, got {} ({})", shown(v), json_kind(v)),
           fmt::format("write it as a JSON boolean, e.g. \"{}\": false", key));
  }
  return v.get<bool>();
}

double Config::positive_number(const std::string& key, double fallback) const {
  const double v = number(key, fallback);
  if (!(v > 0)) {
    refuse(key, fmt::format("must be a positive number, got {}", shown(json_.at(key))),
           fmt::format("fix the value in config.json (the default is {})", fallback));
  }
  return v;
}

std::string Config::string(const std::string& key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  const nlohmann::json& v = json_.at(key);
  if (!v.is_string()) {
    refuse(key, fmt::format("must be a string, got {} ({})", shown(v), json_kind(v)),
           fmt::format("write it as a JSON string, e.g. \"{}\": \"{}\"", key, fallback));
  }
  return v.get<std::string>();
}

double finfo_min(DType dtype) {
  switch (dtype) {
    case DType::f16: return -65504.0;
    case DType::bf16: return -3.3895313892515355e38;
    case DType::f32: return -static_cast<double>(std::numeric_limits<float>::max());
    case DType::f64: return -std::numeric_limits<double>::max();
    default: throw DTypeError(fmt::format("finfo_min: {} is not a floating dtype", dtype_name(dtype)));
  }
}

void check_tokens(const Tensor& tokens, const std::string& model, std::int64_t max_t) {
  if (tokens.dtype() != DType::i64 || tokens.dim() != 2 || tokens.size(0) < 1 || tokens.size(1) < 1) {
    throw ShapeError(fmt::format("{}: the input must be i64 token ids of shape [B, T] (B, T >= 1), got {} of shape {}",
                                 model, dtype_name(tokens.dtype()), shape_str(tokens.shape())));
  }
  if (max_t > 0 && tokens.size(1) > max_t) {
    throw ShapeError(fmt::format("{}: {} tokens per sequence, but the model has {} positions (n_positions)\nhint: "
                                 "use a context of at most {} tokens",
                                 model, tokens.size(1), max_t, max_t));
  }
}

// ---- layers ----

Tensor ModuleList::forward(const Tensor& x) {
  Tensor h = x;
  for (const auto& m : items_) h = (*m)(h);
  return h;
}

Linear::Linear(WeightSource& source, const std::string& path, std::int64_t in, std::int64_t out, bool bias, double std)
    : nn::Module("Linear") {
  register_parameter("weight", source.take(path + ".weight", {out, in}, init_normal(std)));
  if (bias) register_parameter("bias", source.take(path + ".bias", {out}, init_zeros()));
}

Tensor Linear::forward(const Tensor& x) {
  return linear(x, weight(), has_parameter("bias") ? parameter("bias") : Tensor());
}

Conv1D::Conv1D(WeightSource& source, const std::string& path, std::int64_t in, std::int64_t out, double std)
    : nn::Module("Conv1D") {
  register_parameter("weight", source.take(path + ".weight", {in, out}, init_normal(std)));
  register_parameter("bias", source.take(path + ".bias", {out}, init_zeros()));
}

// HF: addmm(bias, x.view(-1, in), W).view(..., out): one matrix product with the bias added before its single
// rounding, which is linear() with the transposed weight.
Tensor Conv1D::forward(const Tensor& x) { return linear(x, parameter("weight").transpose(0, 1), parameter("bias")); }

LayerNorm::LayerNorm(WeightSource& source, const std::string& path, std::int64_t dim, double eps)
    : nn::Module("LayerNorm"), dim_(dim), eps_(eps) {
  register_parameter("weight", source.take(path + ".weight", {dim}, init_ones()));
  register_parameter("bias", source.take(path + ".bias", {dim}, init_zeros()));
}

Tensor LayerNorm::forward(const Tensor& x) {
  return layer_norm(x, {dim_}, parameter("weight"), parameter("bias"), eps_);
}

Embedding::Embedding(WeightSource& source, const std::string& path, std::int64_t num, std::int64_t dim, double std,
                     std::optional<std::int64_t> padding_idx)
    : nn::Module("Embedding"), padding_idx_(padding_idx) {
  register_parameter("weight", source.take(path + ".weight", {num, dim}, init_normal(std, padding_idx)));
}

Tensor Embedding::forward(const Tensor& x) {
  Tensor w = weight();
  if (padding_idx_ && w.requires_grad() && grad_enabled()) {
    // The same values, through a node whose backward zeroes the padding row: PyTorch's embedding backward
    // skips padding_idx, so that row learns nothing from the lookup.
    const std::int64_t row = *padding_idx_;
    w = autograd::record("embedding_padding_idx", w.detach(), {w}, [row](const Tensor& g, const std::vector<bool>&) {
      NoGradGuard no_grad;
      RuntimeInternalGuard internal;
      Tensor masked = g.clone();
      masked.slice(0, row, row + 1).fill_(0.0);
      return std::vector<Tensor>{masked};
    });
  }
  return embedding(x, w);
}

Tensor shape_placeholder(const Shape& shape) {
  NoGradGuard no_grad;
  if (shape.empty()) return zeros({});
  return zeros(Shape(shape.size(), 1)).expand(shape);
}

Tensor TiedHead::forward(const Tensor& x) { return linear(x, embedding_->weight()); }

// ---- weight sources ----

Tensor RandomSource::take(const std::string&, const Shape& shape, const Init& init) {
  NoGradGuard no_grad;
  RuntimeInternalGuard internal;  // initialisation is not the model's forward pass
  switch (init.kind) {
    case Init::Kind::ones: return ones(shape);
    case Init::Kind::zeros: return zeros(shape);
    case Init::Kind::constant: return full(shape, init.value);
    case Init::Kind::normal: break;
  }
  Tensor t = mul(randn(shape, gen_), init.std);
  if (init.zero_row) t.slice(0, *init.zero_row, *init.zero_row + 1).fill_(0.0);
  return t;
}

Tensor ShapeOnlySource::take(const std::string&, const Shape& shape, const Init&) {
  if (left_-- == 0) {
    throw ModelError(fmt::format("{}: config.json describes a model with far more weights than the checkpoint's {} "
                                 "tensors\nhint: the config does not belong to these weights: compare {}",
                                 where_, held_, compare_));
  }
  return shape_placeholder(shape);
}

Tensor CheckpointSource::take(const std::string& name, const Shape& shape, const Init&) {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    missing_.push_back(name);
    return shape_placeholder(shape);
  }
  Tensor t = it->second;
  tensors_.erase(it);
  if (t.shape() != shape) {
    wrong_shapes_.push_back(fmt::format("{}: the checkpoint has {}, the config needs {}", name, shape_str(t.shape()),
                                        shape_str(shape)));
    return shape_placeholder(shape);
  }
  return t;
}

// ---- the folder's files ----

nlohmann::json read_config(const std::filesystem::path& folder) {
  const std::filesystem::path path = folder / "config.json";
  std::string text;
  if (auto problem = ampscope::detail::read_input_file(path, kMaxConfigBytes, text)) {
    using Kind = ampscope::detail::FileProblem::Kind;
    if (problem->kind == Kind::cannot_open) {
      throw ModelError(fmt::format("{}: cannot open config.json: {}\nhint: a Hugging Face model folder holds "
                                   "config.json beside model.safetensors; point --model at that folder",
                                   path.string(), problem->what));
    }
    throw ModelError(fmt::format("{}: {}\nhint: {}", path.string(), problem->describe(),
                                 problem->kind == Kind::not_regular
                                     ? "config.json must be a regular file (a FIFO or a device is never read)"
                                 : problem->kind == Kind::too_large
                                     ? "a config.json describes the architecture in a few kilobytes; restore the "
                                       "file from the model's source"
                                     : "check the disk, and restore the file from the model's source"));
  }
  nlohmann::json json;
  if (auto problem = ampscope::detail::parse_json(text, json)) {
    throw ModelError(fmt::format("{}: {}{}\nhint: restore the file from the model's source", path.string(),
                                 problem->too_deep ? "" : "not valid JSON: ", problem->what));
  }
  return json;
}

void check_nonfinite(const std::filesystem::path& folder, const std::vector<safetensors::NonFiniteTensor>& found,
                     LoadReport& report, const LoadOptions& options) {
  std::vector<std::string> lines;
  for (const auto& t : found) {
    const auto listed = [&](const std::vector<std::string>& names) {
      return std::find(names.begin(), names.end(), t.name) != names.end();
    };
    if (listed(report.unexpected) || listed(report.ignored)) continue;  // not the model's weights
    lines.push_back(t.describe());
  }
  if (lines.empty()) return;
  if (options.allow_nonfinite) {
    report.nonfinite = std::move(lines);
    return;
  }
  std::string msg = fmt::format("{}: {} weight{} of the checkpoint hold{} NaN or Inf:", folder.string(), lines.size(),
                                lines.size() == 1 ? "" : "s", lines.size() == 1 ? "s" : "");
  for (std::size_t i = 0; i < lines.size() && i < 8; ++i) msg += "\n" + lines[i];
  if (lines.size() > 8) msg += fmt::format("\n... and {} more", lines.size() - 8);
  msg += "\nhint: the weights are damaged, or were saved by a run that had diverged: a run would start from NaN. Use "
         "other weights, or accept these explicitly (hf::LoadOptions::allow_nonfinite; ampscope train "
         "--model-allow-nonfinite)";
  throw ModelError(msg);
}

void save_folder(const nlohmann::json& config, const std::vector<std::pair<std::string, Tensor>>& tensors,
                 const std::filesystem::path& folder) {
  if (std::filesystem::exists(folder / "model.safetensors.index.json")) {
    throw ModelError(fmt::format("{}: holds model.safetensors.index.json, which would make loaders read its shards "
                                 "instead of the model.safetensors written now\nhint: save into a new folder",
                                 folder.string()));
  }
  std::filesystem::create_directories(folder);
  const std::filesystem::path config_path = folder / "config.json";
  // Both names are checked before either file is written: a folder someone else prepared may hold a link
  // (or a FIFO) at either, and a refusal must not leave a new config.json beside old weights. Each is written
  // under a fresh temporary name and renamed over its target (core/io/output_file.h), so a failed write leaves
  // the old file whole and a link is never written through.
  refuse_unsafe_output(config_path, "the model's config.json");
  refuse_unsafe_output(folder / "model.safetensors", "the safetensors file");
  {
    OutputFile file(config_path, "the model's config.json");
    file.write(config.dump(2) + "\n");
    file.commit(/*durable=*/true);
  }
  safetensors::save(folder / "model.safetensors", tensors, {{"format", "pt"}});
}

namespace {

std::shared_ptr<CausalLM> build(const Config& config, WeightSource& source) {
  if (!config.has("model_type")) {
    config.refuse("model_type", "is missing; it says which architecture the weights belong to",
                  "add \"model_type\": \"gpt2\", \"llama\" or \"mistral\"");
  }
  const std::string type = config.string("model_type", "");
  if (type == "gpt2") return build_gpt2(config, source);
  if (type == "llama" || type == "mistral") return build_llama(config, source);
  if (type == "t5") {  // models/hf_t5.h
    throw ModelError(fmt::format("{}: model_type 't5' is an encoder-decoder model, not a causal language model\nhint: "
                                 "load it with load_seq2seq (models/hf_t5.h); is_seq2seq_folder tells the kinds apart",
                                 config.where()));
  }
  throw ModelError(fmt::format("{}: model_type '{}' is not supported (supported: gpt2, llama, mistral)\nhint: ampscope "
                               "builds GPT-2 and Llama-style decoders (Mistral's grouped-query attention included); "
                               "for another architecture, write the model with ampscope's nn modules (docs/api.md)",
                               config.where(), ampscope::detail::text_excerpt(type)));
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// Bit-equal f32 CPU tensors of one shape (what load_folder returns), without widening a vocabulary-sized
// matrix to doubles.
bool same_values(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != DType::f32 || b.dtype() != DType::f32) return false;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_as<float>(), cb.data_as<float>(), static_cast<std::size_t>(ca.numel()) * sizeof(float)) == 0;
}

bool is_ignored_buffer(const std::string& name) {
  const auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends_with(".attn.bias") || ends_with(".attn.masked_bias") || ends_with("rotary_emb.inv_freq");
}

}  // namespace
}  // namespace detail

LoadedModel load_model(const std::filesystem::path& folder, const LoadOptions& options) {
  using namespace detail;
  const nlohmann::json json = read_config(folder);
  const Config config(json, (folder / "config.json").string());
  const std::string type = config.has("model_type") ? config.string("model_type", "") : "";

  // Validate the config (and refuse what is refused) with a dry run on a source that only records shapes
  // (placeholders, no memory), and bounded by the checkpoint: a config that describes many more weights than
  // the checkpoint holds (n_layer 1000000 beside two layers of weights) is refused before it costs a build.
  std::vector<safetensors::NonFiniteTensor> nonfinite;
  std::map<std::string, Tensor> stored = safetensors::load_folder(folder, DType::f32, &nonfinite);
  {
    ShapeOnlySource dry(folder.string(), stored.size(),
                        "its layer count (n_layer, num_hidden_layers) with the checkpoint's layer names");
    (void)build(config, dry);
  }
  LoadReport report;
  // Known buffers first, by the checkpoint's names.
  for (auto it = stored.begin(); it != stored.end();) {
    if (is_ignored_buffer(it->first)) {
      report.ignored.push_back(it->first);
      it = stored.erase(it);
    } else {
      ++it;
    }
  }
  // The layouts HF's from_pretrained accepts: GPT-2 names with "transformer." (GPT2LMHeadModel) or without
  // (GPT2Model); Llama names with "model." (LlamaForCausalLM) or without (LlamaModel).
  const bool gpt2 = type == "gpt2";
  const std::string base_prefix = gpt2 ? "transformer." : "model.";
  bool has_prefix = false;
  for (const auto& [name, t] : stored) has_prefix = has_prefix || starts_with(name, base_prefix);
  std::map<std::string, Tensor> renamed;
  std::map<std::string, std::string> original;  // model name -> checkpoint name
  for (auto& [name, t] : stored) {
    std::string ours = name;
    if (gpt2 && has_prefix && starts_with(name, base_prefix)) ours = name.substr(base_prefix.size());
    if (!gpt2 && !has_prefix && !starts_with(name, "lm_head.")) ours = base_prefix + name;
    if (renamed.count(ours) != 0) {
      throw ModelError(fmt::format("{}: the checkpoint holds both '{}' and '{}', which name the same parameter\nhint: "
                                   "keep one of them",
                                   folder.string(), original.at(ours), name));
    }
    original[ours] = name;
    renamed.emplace(ours, t);
  }
  const std::string layout = gpt2 ? (has_prefix ? base_prefix : "") : (has_prefix || stored.empty() ? base_prefix : "");

  CheckpointSource source(std::move(renamed));
  std::shared_ptr<CausalLM> model = build(config, source);
  model->set_checkpoint_prefix(layout);

  // A tied head's lm_head.weight: HF ties it to the embedding after loading; a copy equal to the embedding
  // is redundant (ignored), a different one would be silently replaced, so it is refused.
  // A head still unclaimed means the model ties it (an untied model took it as its parameter).
  auto head = source.tensors_.find("lm_head.weight");
  if (head != source.tensors_.end()) {
    const std::string embedding = gpt2 ? "wte.weight" : "model.embed_tokens.weight";
    Tensor emb;
    for (const auto& [name, p] : model->named_parameters()) {
      if (name == embedding) emb = p;
    }
    if (emb.defined() && same_values(head->second, emb)) {
      report.ignored.push_back(original.at("lm_head.weight"));
      source.tensors_.erase(head);
    } else {
      throw ModelError(fmt::format(
          "{}: the config ties the output head to the embedding (tie_word_embeddings is true, or absent for "
          "gpt2), but the checkpoint's '{}' differs from '{}{}'\nhint: set \"tie_word_embeddings\": false in "
          "config.json to use the checkpoint's head as its own parameter",
          folder.string(), original.at("lm_head.weight"), layout, embedding));
    }
  }
  if (!source.missing_.empty() || !source.wrong_shapes_.empty()) {
    std::string msg = fmt::format("{}: the checkpoint does not fit the {} config", folder.string(), type);
    if (!source.missing_.empty()) {
      std::vector<std::string> names;
      for (const std::string& m : source.missing_) {  // as the checkpoint's layout would name them
        if (gpt2 && !starts_with(m, "lm_head.")) names.push_back(layout + m);
        else if (!gpt2 && layout.empty() && starts_with(m, base_prefix)) names.push_back(m.substr(base_prefix.size()));
        else names.push_back(m);
      }
      msg += fmt::format("\n{} missing weight{}: {}", names.size(), names.size() == 1 ? "" : "s",
                         fmt::join(names, ", "));
    }
    for (const auto& w : source.wrong_shapes_) msg += "\nwrong shape: " + w;
    msg += "\nhint: the weights must come from a model with this config.json (same sizes and layer count); a "
           "missing lm_head.weight with tie_word_embeddings false means the head was not saved";
    throw ModelError(msg);
  }
  for (const auto& [name, t] : source.tensors_) report.unexpected.push_back(original.at(name));
  std::sort(report.ignored.begin(), report.ignored.end());
  std::sort(report.unexpected.begin(), report.unexpected.end());
  check_nonfinite(folder, nonfinite, report, options);
  return {model, report};
}

std::shared_ptr<CausalLM> make_model(const nlohmann::json& config, Generator& gen) {
  detail::RandomSource source(gen);
  return detail::build(detail::Config(config, "config"), source);
}

void save_model(CausalLM& model, const std::filesystem::path& folder) {
  detail::save_folder(model.config(), model.checkpoint_tensors(), folder);
}

}  // namespace ampscope::samples::hf
