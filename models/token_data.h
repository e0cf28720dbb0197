// models/token_data.h: token files (`--tokens FILE`) and the deterministic batching of the models loaded
// from checkpoints (issues 18 and 19). Three formats, chosen by the file's extension:
//   .npy  numpy's format, versions 1.0, 2.0 and 3.0; dtype '<i4', '<i8', '<u2' or '|u1'; C order; any
//         shape, read flattened (np.save of a tokenizer's ids)
//   .bin  raw little-endian uint16, as nanoGPT's prepare.py writes (np.array(ids, np.uint16).tofile)
//   .txt  whitespace-separated non-negative decimal integers
// Every reader checks everything and throws TokenFileError naming the file, where (byte offset, line and
// column, or element index), what is wrong and a `hint:` line. Only regular files are opened (a FIFO or a
// device is refused before open() could block). A run keeps its tokens in a TokenSequence: a .npy or .bin
// file stays on disk and each batch reads its windows from it, so a token file of any size (nanoGPT's 17 GB
// OpenWebText) costs the same few kilobytes of memory; ids from a .txt file or a tokenizer are held in
// memory at 2 bytes each (4 when an id is 65536 or more).
//
//   TokenSequence ids = TokenSequence::open("data/train.bin");
//   check_vocabulary(ids, 50257, "data/train.bin");
//   TokenBatch b = causal_lm_batch(ids, /*context=*/256, /*batch=*/4, /*step=*/0);  // b.x, b.y: i64 [4, 256]
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace ampscope::samples {

// A token file that cannot be read, or token ids that do not fit the model or the window rule.
class TokenFileError : public Error {
 public:
  using Error::Error;
};

// The largest id a token file may hold: ids are stored as int32 (2^31 - 1).
inline constexpr std::int64_t kMaxTokenId = 2147483647;

// Token ids without the whole of a large file in memory. open() reads a token file and checks all of it
// (load_tokens's rules, below) in bounded memory: a .npy or .bin file then stays open and read() takes ids
// from it (pread), a .txt file's ids are kept in memory. An in-memory sequence (a tokenizer's output) is made
// empty and filled with append(). Movable, not copyable.
class TokenSequence {
 public:
  TokenSequence();  // empty, in memory
  TokenSequence(TokenSequence&&) noexcept;
  TokenSequence& operator=(TokenSequence&&) noexcept;
  ~TokenSequence();

  static TokenSequence open(const std::filesystem::path& path);
  static TokenSequence from_ids(const std::vector<std::int32_t>& ids);  // in memory

  // Appends ids (each in [0, kMaxTokenId]; Error otherwise) to an in-memory sequence (Error for a file's).
  void append(const std::int32_t* ids, std::size_t count);

  std::int64_t size() const;
  std::int32_t max_id() const;  // the largest id, -1 when empty
  bool on_disk() const;         // read from its file by read()
  // Ids [begin, begin + count) as i64 into out. Error when the range is outside the sequence; TokenFileError
  // when the file cannot be read any more (it was truncated or removed while the run was going).
  void read(std::int64_t begin, std::int64_t count, std::int64_t* out) const;
  std::vector<std::int32_t> to_vector() const;

  struct Storage;  // (token_data.cpp)

 private:
  std::unique_ptr<Storage> s_;
};

// Reads a token file, chosen by its extension (.npy, .bin, .txt; case-insensitive); any other extension
// is refused, listing the three. Refused with TokenFileError: a file that cannot be opened or is not a
// regular file (a FIFO, a device, a folder: refused before it is opened); an empty file or one that holds
// no tokens; for .npy a wrong magic, an unknown version, a header length past the end of the file, a header
// that is not the dict numpy writes (with the keys 'descr', 'fortran_order', 'shape', each once), an
// unsupported dtype (big-endian, floating, structured, ...), fortran_order True, a 0-d array, data shorter
// or longer than the shape; for .bin an odd byte count (and an llm.c file with its 1024-byte header, or a
// .npy file named .bin); for .txt anything but digits and whitespace (with line and column). In every
// format, negative ids and ids above kMaxTokenId. (TokenSequence::open(path).to_vector().)
std::vector<std::int32_t> load_tokens(const std::filesystem::path& path);

// Every id below `vocab`, else TokenFileError naming the file, the first offending index, its id and the
// vocabulary size. `vocab` must be positive (Error otherwise). The sequence's form reads a file's ids again
// only when its largest id is outside the vocabulary, to say where.
void check_vocabulary(const std::vector<std::int32_t>& tokens, std::int64_t vocab, const std::filesystem::path& path);
void check_vocabulary(const TokenSequence& tokens, std::int64_t vocab, const std::filesystem::path& path);

// The number of whole windows `tokens` tokens make at context `context`:
//   decoder models (seq2seq false): window k covers tokens [k*T, k*T + T + 1), so floor((n - 1) / T);
//   T5 (seq2seq true, T even):      window k covers tokens [k*T, k*T + T),     so floor(n / T).
// Throws TokenFileError when there is no whole window, saying how many tokens one window needs; Error
// for a context below 1 (below 2, or odd, for seq2seq).
std::int64_t window_count(std::int64_t tokens, std::int64_t context, bool seq2seq);

// Decoder-model batching (issue 18): window k covers tokens[k*T, k*T + T + 1); its first T tokens are the
// inputs, its last T the targets. Step s uses windows s*B, s*B + 1, ..., s*B + B - 1, each taken modulo
// the number of whole windows (window_count); no shuffling, so the batch of a step is always the same.
// x and y are i64 [B, T] CPU tensors. Error for batch < 1 or step < 0.
struct TokenBatch {
  Tensor x, y;
};
TokenBatch causal_lm_batch(const std::vector<std::int32_t>& tokens, std::int64_t context, std::int64_t batch,
                           std::int64_t step);
TokenBatch causal_lm_batch(const TokenSequence& tokens, std::int64_t context, std::int64_t batch, std::int64_t step);

// T5's batching (issue 19): window k covers tokens[k*T, k*T + T) with T even; its first T/2 tokens are the
// encoder input, its last T/2 the labels; the decoder input is the labels shifted right by one with
// `decoder_start_token_id` in front (Hugging Face's _shift_right). Windows per step as above. All three
// are i64 [B, T/2] CPU tensors.
struct Seq2SeqBatch {
  Tensor encoder_input, decoder_input, labels;
};
Seq2SeqBatch seq2seq_batch(const std::vector<std::int32_t>& tokens, std::int64_t context, std::int64_t batch,
                           std::int64_t step, std::int64_t decoder_start_token_id);
Seq2SeqBatch seq2seq_batch(const TokenSequence& tokens, std::int64_t context, std::int64_t batch, std::int64_t step,
                           std::int64_t decoder_start_token_id);

}  // namespace ampscope::samples
