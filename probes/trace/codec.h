// probes/trace/codec.h: compresses a chunk of trace records exactly as HDF5's shuffle + deflate filter
// pipeline would (internal to ampscope_trace), so the writer can compress chunks on several threads
// and hand HDF5 finished bytes (H5Dwrite_chunk); HDF5, h5py and h5dump decode them with their own
// filters. zlib comes with HDF5 (Debian's libhdf5 links it, and libhdf5-dev depends on zlib1g-dev).
//
//   detail::ChunkCodec codec(record_bytes, chunk_rows, /*level=*/1, /*run_length=*/{{8, 16}});
//   std::vector<std::byte> out;
//   codec.encode(rows, row_count, out);   // as if rows beyond row_count, up to chunk_rows, were zeros
//
// The reader goes the other way with ChunkDecoder, for chunks HDF5 or the writer stored (H5Dread_chunk):
//   detail::ChunkDecoder decoder(record_bytes, chunk_rows);
//   if (decoder.inflate(stored.data(), stored.size())) decoder.unshuffle(first, count, records);
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace ampscope::trace::detail {

// HDF5's shuffle filter on `records` whole records: byte b of record i goes to out[b * column + i]
// (column = records for a whole chunk; a partial chunk leaves room for the records still to come).
void shuffle_records(const std::byte* in, std::size_t records, std::size_t record_bytes, std::size_t column, std::byte* out);

// The inverse: records [first, first + records) of a shuffled chunk whose byte columns are `column`
// records long, put back together in `out` (record 0 of out is record `first` of the chunk).
void unshuffle_records(const std::byte* in, std::size_t column, std::size_t first, std::size_t records, std::size_t record_bytes,
                       std::byte* out);

// zlib's Adler-32 checksum of `size` bytes, continuing from `adler` (1 to start).
std::uint32_t adler32_of(std::uint32_t adler, const std::byte* data, std::size_t size);

// Bytes [begin, end) of a record.
struct ByteRange {
  std::size_t begin = 0, end = 0;
};

class ChunkCodec {
 public:
  // level 0: no filters (chunks are stored raw); 1..9: shuffle, then deflate at that level. The byte
  // columns of `run_length` (the records' floating-point fields: their mantissas look random) are
  // coded as zlib's run-length strategy would (literals and runs at distance 1), by the codec itself, in
  // dynamic-Huffman blocks of kRunLengthColumns columns each; the rest (text, counters) is deflated by
  // zlib with its default strategy, whose string matches text needs. In a range of
  // 8-byte fields (f64), the six low bytes of each are mantissa bits; in a chunk of 256 rows or more, a
  // byte column of them whose bytes are as varied as random ones (the sum of their squared byte counts
  // within 2^0.1 of random bytes') is put in deflate's stored blocks: Huffman coding saves nothing on
  // such bytes and cost two thirds of a trace chunk's compression time. The test looks at the bytes, so
  // a range that is not f64 fields after all only loses the speed-up. The stream is zlib's deflate of
  // pieces of at most kPieceBytes input bytes, each from a fresh state, with the stored and run-length
  // blocks written by encode() itself between them (see encode); any deflate decoder (HDF5's filter)
  // reads it as one stream.
  ChunkCodec(std::size_t record_bytes, std::size_t chunk_rows, int level, const std::vector<ByteRange>& run_length = {});
  ~ChunkCodec();
  ChunkCodec(const ChunkCodec&) = delete;
  ChunkCodec& operator=(const ChunkCodec&) = delete;

  // The stored bytes of a chunk holding `rows` records (rows <= chunk_rows), the rest zeros.
  // Throws std::runtime_error when zlib fails (it does not, short of memory).
  //
  // partial_budget: a partial chunk (rows < chunk_rows) of a codec with fewer than kOwnRunLengthRows chunk rows
  // is written by the codec alone, without zlib, when that takes at most partial_budget bytes (0: never): one
  // block of deflate's fixed codes, literals, runs at distance 1 and matches found by a hash of 3 bytes, each
  // column's zeros beyond `rows` a few runs, no Huffman codes to build (see encode_fixed_runs). A short step's end
  // rewrites such a chunk at every step, and zlib spent most of that time building a block's codes and scanning the
  // zeros; the bytes are up to 1.1x zlib's on the MLP's trace rows, hence the budget, which the writer sets so that
  // the chunk still fits the space kept for it in the file. Full chunks are always zlib's, as before.
  void encode(const std::byte* records, std::size_t rows, std::vector<std::byte>& out, std::size_t partial_budget = 0);

 private:
  struct Deflater;
  struct Region {
    std::size_t begin, end;  // byte columns
    int strategy;            // zlib's
    bool mantissas = false;  // run-length f64 columns: their low six bytes may be stored (see above)
  };
  // A stretch of the shuffled chunk deflated with one setting: kStored, or a zlib strategy at level_.
  struct Segment {
    std::size_t begin, size;  // bytes of the shuffled chunk
    int strategy;
  };
  static constexpr int kStored = -1;
  // The most input zlib deflates from one fresh state: below the 64 KiB - 262 bytes at which it slides its
  // window (see encode).
  static constexpr std::size_t kPieceBytes = 64 * 1024 - 1024;
  void add_segment(std::size_t begin, std::size_t size, int strategy);
  // The partial chunk in shuffled_ (each column's first `rows` bytes; the rest of each column is taken as zeros,
  // whatever shuffled_ holds there) as a zlib stream of one fixed-code block, into `out`; false, with `out`
  // undefined, when it would take more than `budget` bytes.
  bool encode_fixed_runs(std::size_t rows, std::size_t budget, std::vector<std::byte>& out);
  // encode_fixed_runs' matches: per hash of 3 bytes, the last position in the shuffled chunk that had it.
  static constexpr unsigned kMatchHashBits = 12;
  static constexpr std::uint32_t kNoCandidate = 0xFFFFFFFFu;
  std::array<std::uint32_t, std::size_t{1} << kMatchHashBits> match_head{};
  bool looks_random(const std::byte* column, std::size_t rows) const;
  std::size_t record_bytes_;
  std::size_t chunk_rows_;
  int level_;
  std::vector<Region> regions_;
  std::vector<Segment> segments_;
  // A run-length stretch's columns per block (see encode): 3 of the 10,000-op-rows-a-step trace_bench case
  // took 23.57 bytes a row and the health trace 31.75 (2 columns: 23.48 and 31.70 but 10% more CPU on the
  // health trace's step ends; 8: 24.00 and 32.12; one block a stretch: 23.95 and 32.03).
  static constexpr std::size_t kRunLengthColumns = 3;
  static constexpr std::size_t kOwnRunLengthRows = 256;  // smaller chunks: zlib codes the run-length columns
  struct RunLengthBlock;
  std::unique_ptr<RunLengthBlock> run_length_;
  std::vector<std::byte> shuffled_;
  std::unique_ptr<Deflater> deflater_;
};

// Undoes the shuffle + deflate pipeline on one chunk, with one reused inflate stream, the SSE2 Adler-32
// and transpose above (HDF5's own filters run byte by byte). Not thread-safe: one per thread.
class ChunkDecoder {
 public:
  ChunkDecoder(std::size_t record_bytes, std::size_t chunk_rows);
  ~ChunkDecoder();
  ChunkDecoder(const ChunkDecoder&) = delete;
  ChunkDecoder& operator=(const ChunkDecoder&) = delete;

  // Inflates a stored chunk (a zlib stream, possibly followed by the writer's zero padding) into the
  // shuffled chunk. False, never an exception, when the bytes are not a zlib stream of exactly
  // record_bytes * chunk_rows bytes whose Adler-32 matches: the caller then lets HDF5 read the chunk,
  // which says what is wrong with it.
  bool inflate(const std::byte* stored, std::size_t size);
  // Inflates only the first `bytes` bytes of the shuffled chunk (its first byte columns: the first
  // field of every record), without the checksum, which needs the whole stream.
  bool inflate_prefix(const std::byte* stored, std::size_t size, std::size_t bytes);
  // The shuffled chunk, after a successful inflate (or its first `bytes`, after inflate_prefix).
  const std::byte* shuffled() const { return shuffled_.data(); }
  // Records [first, first + count) of the chunk inflated last, unshuffled into `out`.
  void unshuffle(std::size_t first, std::size_t count, std::byte* out) const {
    unshuffle_records(shuffled_.data(), chunk_rows_, first, count, record_bytes_, out);
  }

 private:
  struct Inflater;
  bool run(const std::byte* stored, std::size_t size, std::size_t bytes, bool whole);
  std::size_t record_bytes_;
  std::size_t chunk_rows_;
  std::vector<std::byte> shuffled_;
  std::unique_ptr<Inflater> inflater_;
};

}  // namespace ampscope::trace::detail
