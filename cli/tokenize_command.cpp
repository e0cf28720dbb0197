// `ampscope tokenize`: a model folder's tokenizer on a text file. See cli/tokenize_command.h.
#include "cli/tokenize_command.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <iostream>
#include <ostream>

#include <fmt/format.h>

#include "core/error.h"
#include "core/io/input_file.h"
#include "core/io/output_file.h"
#include "models/bpe_tokenizer.h"

namespace ampscope::samples {
namespace {

namespace fs = std::filesystem;

std::string lower_extension(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

std::string ids_line(const std::vector<std::int32_t>& ids) {
  std::string text;
  text.reserve(ids.size() * 6 + 1);
  for (std::size_t k = 0; k < ids.size(); ++k) {
    if (k > 0) text += ' ';
    text += std::to_string(ids[k]);
  }
  text += '\n';
  return text;
}

// numpy's format 1.0: magic, version, a little-endian uint16 header length, the header dict padded with
// spaces and ended by '\n' so that the data starts at a multiple of 64 bytes (numpy's own alignment).
std::string npy_bytes(const std::vector<std::int32_t>& ids) {
  std::string header = fmt::format("{{'descr': '<i4', 'fortran_order': False, 'shape': ({},), }}", ids.size());
  const std::size_t prefix = 10;  // magic (6), version (2), header length (2)
  const std::size_t total = (prefix + header.size() + 1 + 63) / 64 * 64;
  header.append(total - prefix - header.size() - 1, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xFF);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  for (std::int32_t id : ids) {
    const auto v = static_cast<std::uint32_t>(id);
    for (int b = 0; b < 4; ++b) out += static_cast<char>((v >> (8 * b)) & 0xFF);
  }
  return out;
}

std::string bin_bytes(const fs::path& path, const std::vector<std::int32_t>& ids) {
  std::string out;
  out.reserve(ids.size() * 2);
  for (std::size_t k = 0; k < ids.size(); ++k) {
    if (ids[k] > 65535) {
      throw Error(fmt::format("--tokens '{}': id {} (position {}) does not fit a .bin file, whose ids are uint16 (0 to "
                              "65535)\nhint: write a .npy file (int32) or a .txt file instead",
                              path.string(), ids[k], k));
    }
    out += static_cast<char>(ids[k] & 0xFF);
    out += static_cast<char>(ids[k] >> 8);
  }
  return out;
}

}  // namespace

std::string token_file_bytes(const fs::path& path, const std::vector<std::int32_t>& ids) {
  const std::string ext = lower_extension(path);
  if (ext == ".txt") return ids_line(ids);
  if (ext == ".npy") return npy_bytes(ids);
  if (ext == ".bin") return bin_bytes(path, ids);
  throw Error(fmt::format("--tokens '{}': the extension '{}' is not a token file's; the token files `--tokens` reads "
                          "are .txt (ids separated by spaces), .npy (int32) and .bin (uint16, as nanoGPT writes)\n"
                          "hint: name the file with one of those extensions",
                          path.string(), path.extension().string()));
}

int run_tokenize(const TokenizeRequest& request, std::ostream& out) {
  const fs::path output = request.tokens;
  // Refused before the (possibly long) encoding: an OUT that exists (another run's data) unless --overwrite,
  // and an extension no reader knows.
  if (!request.tokens.empty()) {
    token_file_bytes(output, {});
    std::error_code ec;
    const auto type = fs::symlink_status(output, ec).type();
    if (type != fs::file_type::not_found && !request.overwrite) {
      throw Error(fmt::format("--tokens '{}' exists; refusing to overwrite it\nhint: give another --tokens file, or "
                              "--overwrite to replace it",
                              request.tokens));
    }
    refuse_unsafe_output(output, "--tokens");
  }
  // The text file, checked here so that the message is this command's (the tokenizer's own speaks of --text);
  // a FIFO or a device is refused before it is opened.
  {
    detail::InputFile file;
    if (auto problem = detail::open_input_file(request.text, file)) {
      throw Error(fmt::format("text file '{}': {}\nhint: give a regular file of text to tokenize (UTF-8 or any bytes)",
                              request.text, problem->describe()));
    }
  }
  const BpeTokenizer tokenizer = BpeTokenizer::from_folder(request.model);
  std::vector<std::int32_t> ids;
  tokenizer.encode_file(request.text, [&](const std::int32_t* p, std::size_t n) { ids.insert(ids.end(), p, p + n); });
  if (request.tokens.empty()) {
    out << ids_line(ids);
    out.flush();
    return 0;
  }
  write_output_file(output, token_file_bytes(output, ids), "--tokens");
  return 0;
}

TokenizeCommand::TokenizeCommand(CLI::App& app) {
  cmd_ = app.add_subcommand(
      "tokenize", "Print the token ids a model folder's own tokenizer makes of a text file (the ids `ampscope train "
                  "--model DIR --text FILE` trains on), as one line of space-separated ids, or write them as a token "
                  "file for --tokens");
  cmd_->add_option("--model", request_.model,
                   "Model folder whose tokenizer encodes: GPT-2's byte-level BPE, from vocab.json + merges.txt or a "
                   "tokenizer.json (docs/checkpoints.md)")
      ->required();
  cmd_->add_option("file", request_.text, "Text file to tokenize (any bytes; UTF-8 usually)")->required();
  cmd_->add_option("--tokens", request_.tokens,
                   "Write the ids to this token file instead of printing them; the extension chooses the format, as "
                   "train's --tokens reads it: .txt (one line of ids), .npy (int32) or .bin (uint16)");
  cmd_->add_flag("--overwrite", request_.overwrite, "Replace the --tokens file if it exists (refused otherwise)");
}

bool TokenizeCommand::parsed() const { return cmd_->parsed(); }

int TokenizeCommand::run() { return run_tokenize(request_, std::cout); }

}  // namespace ampscope::samples
