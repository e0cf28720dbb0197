// models/bpe_tokenizer.h: GPT-2's byte-level BPE tokenizer, for `ampscope train --model DIR --text FILE`.
// It reads a model folder's vocab.json + merges.txt, or a tokenizer.json whose model is BPE with the
// ByteLevel pre-tokenizer, and turns bytes into token ids exactly as GPT-2's encoder.py does: the
// byte-to-unicode table, the pre-tokenization pattern, merges by rank. docs/checkpoints.md ("Tokenizing
// text: --text") gives the algorithm, the rule for bytes that are not UTF-8, and when to use --tokens.
//
//   auto tok = ampscope::samples::BpeTokenizer::from_folder("gpt2/");
//   std::vector<std::int32_t> ids = tok.encode("Hello world");   // {15496, 995} with GPT-2's files
//   std::string back = tok.decode(ids);                           // "Hello world"
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace ampscope::samples {

// A tokenizer file that cannot be used, or text that the vocabulary cannot encode. The message names the
// file, where in it (line, or JSON path), what is wrong, and a `hint:` line.
class TokenizerError : public Error {
 public:
  using Error::Error;
};

class BpeTokenizer {
 public:
  // A model folder's tokenizer: tokenizer.json when the folder has one (model.type "BPE" with the ByteLevel
  // pre-tokenizer; other kinds are refused by name with the hint to use --tokens), else vocab.json +
  // merges.txt.
  static BpeTokenizer from_folder(const std::filesystem::path& folder);
  // GPT-2's two files. "<|endoftext|>", when the vocabulary holds it, is the one special token (as in
  // GPT-2's encoder.py and Hugging Face's GPT2Tokenizer).
  static BpeTokenizer from_files(const std::filesystem::path& vocab_json, const std::filesystem::path& merges_txt);
  // One tokenizer.json (Hugging Face's tokenizers format); its added_tokens are the special tokens.
  static BpeTokenizer from_tokenizer_json(const std::filesystem::path& tokenizer_json);

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer();

  // Arbitrary bytes, not necessarily UTF-8. Throws TokenizerError when a piece the merges produce is
  // missing from the vocabulary (naming the piece). The cache of repeated pieces lives for one call, so
  // encode and decode may run on several threads at once.
  std::vector<std::int32_t> encode(std::string_view bytes) const;
  // A file's bytes, exactly as encode() of the whole file would give them, read and encoded chunk_bytes at a
  // time: memory holds a chunk and what on_ids(ids, n) keeps, not the text (it cost 25-50 bytes per byte of
  // text when the whole file was read and encoded at once). Only a regular file is read (a FIFO, a device, a
  // folder: TokenizerError naming the file, before it is opened).
  void encode_file(const std::filesystem::path& path, const std::function<void(const std::int32_t*, std::size_t)>& on_ids,
                   std::size_t chunk_bytes = std::size_t{1} << 20) const;
  // The exact bytes back. Throws TokenizerError for an id that names no token.
  std::string decode(const std::vector<std::int32_t>& ids) const;
  // One more than the largest id (vocabulary and special tokens): the rows an embedding needs.
  std::int64_t vocab_size() const;
  // The id of a token given as its vocabulary string (byte symbols, e.g. "Ġthe"), or -1 when it has none.
  std::int32_t token_id(std::string_view token) const;
  // Where the tokenizer came from: "DIR/vocab.json + DIR/merges.txt" or "DIR/tokenizer.json".
  const std::string& source() const;

  // GPT-2's byte-to-unicode table: byte b's symbol as UTF-8 (printable bytes map to themselves, the other
  // 68 to U+0100 onwards in byte order).
  static std::string byte_symbol(unsigned char b);
  // The pre-tokenization alone: the pieces the pattern splits `bytes` into (special tokens not split out).
  static std::vector<std::string> pre_tokenize(std::string_view bytes);

 private:
  struct Impl;
  explicit BpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ampscope::samples
