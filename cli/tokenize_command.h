// cli/tokenize_command.h: `ampscope tokenize --model DIR FILE [--tokens OUT [--overwrite]]`: the token ids a
// model folder's own tokenizer (models/bpe_tokenizer.h: GPT-2's byte-level BPE, from vocab.json + merges.txt
// or tokenizer.json) makes of a text file: the ids `ampscope train --model DIR --text FILE` trains on. Printed
// as one line of space-separated ids, or written as a token file that `--tokens` reads (its format chosen by
// OUT's extension, as the reader chooses it: .txt, .npy int32, .bin uint16). The work is in run_tokenize,
// which writes to the stream given, so tests call it without a subprocess.
//
//   std::ostringstream out;
//   run_tokenize({.model = "gpt2/", .text = "a.txt"}, out);                      // "15496 995\n"
//   run_tokenize({.model = "gpt2/", .text = "a.txt", .tokens = "a.npy"}, out);  // writes a.npy
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace ampscope::samples {

struct TokenizeRequest {
  std::string model{};   // the model folder whose tokenizer encodes
  std::string text{};    // the text file (any bytes)
  std::string tokens{};  // "": the ids on `out`; else the token file to write
  bool overwrite = false;  // replace an existing token file (a link, FIFO or folder is refused even then)
};

// Encodes request.text with the folder's tokenizer and prints the ids or writes the token file (through
// core/io/output_file.h: a temporary file renamed over OUT, never following a name planted there). Throws
// Error naming what was wrong: a folder without a tokenizer, a text file that is missing or not a regular
// file (a FIFO is refused before it is opened), an OUT that exists (without overwrite) or is not a regular
// file, an extension the token readers do not know, an id a .bin file cannot hold. Returns 0.
int run_tokenize(const TokenizeRequest& request, std::ostream& out);

// A token file's bytes in the format `path`'s extension chooses (.txt: the ids space-separated on one line;
// .npy: numpy 1.0, '<i4', shape (n,); .bin: little-endian uint16, as nanoGPT's prepare.py writes). Error for
// another extension, or an id above 65535 in a .bin file.
std::string token_file_bytes(const std::filesystem::path& path, const std::vector<std::int32_t>& ids);

class TokenizeCommand {
 public:
  explicit TokenizeCommand(CLI::App& app);
  bool parsed() const;
  int run();

 private:
  CLI::App* cmd_ = nullptr;
  TokenizeRequest request_;
};

}  // namespace ampscope::samples
