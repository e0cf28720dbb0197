// core/io/json_limits.h (internal: includes nlohmann/json.hpp, a build-only dependency): reading JSON that
// comes from elsewhere (config.json, vocab.json, tokenizer.json, model.safetensors.index.json, the trace's
// config and probe attributes) with its nesting bounded, and showing parts of it in messages.
//
// nlohmann's parser itself keeps its nesting on a heap stack, but much of what is done with the value after
// it recurses once per level: dump() (every error message that prints an offending value), comparisons,
// copies. A file of 10^6 '[' then crashed (SIGSEGV) wherever it was printed. Here the nesting is refused past
// kMaxJsonDepth levels while parsing, before such a value exists, and messages print json_excerpt(), which
// writes at most a few dozen characters without recursing.
//
//   nlohmann::json j;
//   if (auto problem = ampscope::detail::parse_json(text, j))
//     throw MyError(fmt::format("{}: not valid JSON ({})", path, problem->what));
//   fmt::print("got {}", ampscope::detail::json_excerpt(j["shape"]));   // "[1,2,3]", or "[1,2,3,4,...", cut
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace ampscope::detail {

// The deepest nesting of arrays and objects accepted: serde_json's default recursion limit. Nothing the
// project reads comes near it (Hugging Face configs and tokenizer.json nest under 10 levels, a safetensors
// header 3, a trace's config 2).
inline constexpr std::size_t kMaxJsonDepth = 128;

// Why a text was refused: `what` is one line, nlohmann's own error text (cut to 300 characters) followed by
// the place it stopped ("at 'rope_theta'", "at 'model.merges[3]'") when it was inside a value, or the nesting
// ("arrays and objects nest deeper than 128 levels (byte offset 128, at 'a[0][0]...')"). too_deep says which.
struct JsonProblem {
  std::string what;
  bool too_deep = false;
};

// A piece of text for a message: printable ASCII kept, every other byte as \xNN, at most max_chars
// characters of the text, "..." when cut.
inline std::string text_excerpt(std::string_view s, std::size_t max_chars = 40) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < max_chars; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') out += static_cast<char>(c);
    else out += fmt::format("\\x{:02x}", c);
  }
  if (s.size() > max_chars) out += "...";
  return out;
}

// A value as compact JSON (as dump() writes it), cut to max_chars characters ("..." in its last three) when
// longer. Written with a stack of its own, and stops once it has max_chars + 1 characters, so neither the
// nesting nor the size of the value matter. Strings that are not UTF-8 are shown with U+FFFD.
inline std::string json_excerpt(const nlohmann::json& value, std::size_t max_chars = 60) {
  using json = nlohmann::json;
  const std::size_t enough = max_chars + 1;
  std::string out;
  const auto scalar = [&](const json& v) {
    if (v.is_string() && v.get_ref<const std::string&>().size() > enough) {
      // Escaping never shortens, so the first `enough` bytes give the first `enough` characters (a UTF-8
      // sequence cut at the end is replaced past them).
      out += json(v.get_ref<const std::string&>().substr(0, enough)).dump(-1, ' ', false, json::error_handler_t::replace);
    } else {
      out += v.dump(-1, ' ', false, json::error_handler_t::replace);
    }
  };
  struct Frame {
    const json* value;
    json::const_iterator next;
    bool first;
  };
  std::vector<Frame> stack;
  const auto open = [&](const json& v) {
    if (v.is_array() || v.is_object()) {
      out += v.is_array() ? '[' : '{';
      stack.push_back({&v, v.cbegin(), true});
    } else {
      scalar(v);
    }
  };
  open(value);
  while (!stack.empty() && out.size() < enough) {
    Frame& f = stack.back();
    if (f.next == f.value->cend()) {
      out += f.value->is_array() ? ']' : '}';
      stack.pop_back();
      continue;
    }
    if (!f.first) out += ',';
    f.first = false;
    if (f.value->is_object()) {
      scalar(json(f.next.key()));
      out += ':';
    }
    const json& child = *f.next;
    ++f.next;
    open(child);  // may grow the stack: `f` is not used after this
  }
  if (out.size() > max_chars) out = out.substr(0, max_chars >= 3 ? max_chars - 3 : 0) + "...";
  return out;
}

namespace json_limits_detail {

// Where in the document the parser is: one frame per open array or object, with the key or index of the
// value being read in it (`inside` false between values).
class Path {
 public:
  void open(bool array) { frames_.push_back({array, {}, 0, false}); }
  void close() {
    frames_.pop_back();
    done();
  }
  void key(const std::string& k) {
    frames_.back().key = k;
    frames_.back().inside = true;
  }
  // A value starts: in an array it is the next element.
  void begin() {
    if (!frames_.empty() && frames_.back().array) {
      frames_.back().inside = true;
    }
  }
  // A value ended.
  void done() {
    if (frames_.empty()) return;
    Frame& f = frames_.back();
    if (f.array && f.inside) ++f.index;
    f.inside = false;
  }
  std::size_t depth() const { return frames_.size(); }
  // "model.merges[3]", cut to about 80 characters.
  std::string text() const {
    std::string out;
    for (const Frame& f : frames_) {
      if (!f.inside) break;
      if (f.array) out += fmt::format("[{}]", f.index);
      else {
        if (!out.empty()) out += '.';
        out += text_excerpt(f.key, 40);
      }
      if (out.size() > 80) return out + "...";
    }
    return out;
  }

 private:
  struct Frame {
    bool array;
    std::string key;
    std::uint64_t index;
    bool inside;
  };
  std::vector<Frame> frames_;
};

// The byte offset of the '[' or '{' that opens level max_depth + 1 of a text the parser read that far.
inline std::size_t too_deep_offset(std::string_view text, std::size_t max_depth) {
  std::size_t depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return text.size();
}

// The SAX handler: builds the value (when `out` is not null) while it checks the depth.
class BoundedBuilder {
 public:
  using json = nlohmann::json;
  BoundedBuilder(json* out, std::size_t max_depth) : out_(out), max_depth_(max_depth) {}

  bool null() { return value(nullptr); }
  bool boolean(bool v) { return value(v); }
  bool number_integer(json::number_integer_t v) { return value(v); }
  bool number_unsigned(json::number_unsigned_t v) { return value(v); }
  bool number_float(json::number_float_t v, const std::string&) { return value(v); }
  bool string(std::string& v) { return value(std::move(v)); }
  bool binary(json::binary_t& v) { return value(std::move(v)); }
  bool start_object(std::size_t) { return open(false); }
  bool key(std::string& k) {
    path_.key(k);
    if (out_ != nullptr) key_ = std::move(k);
    return true;
  }
  bool end_object() { return close(); }
  bool start_array(std::size_t) { return open(true); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) {
    std::string what = e.what();
    if (what.size() > 300) what = what.substr(0, 297) + "...";
    const std::string at = path_.text();
    problem_ = JsonProblem{at.empty() ? what : fmt::format("{} at '{}'", what, at), false};
    return false;
  }

  std::optional<JsonProblem>& problem() { return problem_; }
  const Path& path() const { return path_; }

 private:
  template <class V>
  bool value(V&& v) {
    path_.begin();
    if (out_ != nullptr) place(json(std::forward<V>(v)));
    path_.done();
    return true;
  }
  bool open(bool array) {
    path_.begin();
    if (path_.depth() + 1 > max_depth_) {
      too_deep_ = true;
      return false;
    }
    if (out_ != nullptr) stack_.push_back(place(array ? json::array() : json::object()));
    path_.open(array);
    return true;
  }
  bool close() {
    if (out_ != nullptr) stack_.pop_back();
    path_.close();
    return true;
  }
  // Puts v where the document is: the root, the next element of an array, the value of the last key.
  json* place(json&& v) {
    if (stack_.empty()) {
      *out_ = std::move(v);
      return out_;
    }
    json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    json& slot = parent[key_];  // a repeated key keeps its last value, as nlohmann::json::parse does
    slot = std::move(v);
    return &slot;
  }

 public:
  bool too_deep_ = false;

 private:
  json* out_;
  std::size_t max_depth_;
  std::vector<json*> stack_;
  std::string key_;
  Path path_;
  std::optional<JsonProblem> problem_;
};

inline std::optional<JsonProblem> run(std::string_view text, nlohmann::json* out, std::size_t max_depth) {
  BoundedBuilder builder(out, max_depth);
  const bool ok = nlohmann::json::sax_parse(text.data(), text.data() + text.size(), &builder);
  if (ok) return std::nullopt;
  if (builder.too_deep_) {
    const std::string at = builder.path().text();
    return JsonProblem{fmt::format("arrays and objects nest deeper than {} levels (byte offset {}{})", max_depth,
                                   too_deep_offset(text, max_depth), at.empty() ? "" : ", at '" + at + "'"),
                       true};
  }
  if (builder.problem()) return builder.problem();
  return JsonProblem{"the parser stopped without saying why", false};  // not reached: every stop sets one
}

}  // namespace json_limits_detail

// Parses `text` (UTF-8 JSON, as nlohmann::json::parse reads it) into `out`; nullopt on success, else the
// problem (and `out` is left null). Nesting deeper than max_depth is refused before it is built.
inline std::optional<JsonProblem> parse_json(std::string_view text, nlohmann::json& out,
                                             std::size_t max_depth = kMaxJsonDepth) {
  out = nullptr;
  auto problem = json_limits_detail::run(text, &out, max_depth);
  if (problem) out = nullptr;
  return problem;
}

// The same checks without building the value (nlohmann::json::accept with the nesting bounded).
inline std::optional<JsonProblem> check_json(std::string_view text, std::size_t max_depth = kMaxJsonDepth) {
  return json_limits_detail::run(text, nullptr, max_depth);
}

}  // namespace ampscope::detail
