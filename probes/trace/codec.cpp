#include "probes/trace/codec.h"

#include <zlib.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace ampscope::trace::detail {

namespace {

void shuffle_scalar(const std::byte* in, std::size_t first_row, std::size_t last_row, std::size_t first_byte,
                    std::size_t record_bytes, std::size_t column, std::byte* out) {
  for (std::size_t b = first_byte; b < record_bytes; ++b) {
    std::byte* o = out + b * column;
    for (std::size_t i = first_row; i < last_row; ++i) o[i] = in[i * record_bytes + b];
  }
}

#if defined(__SSE2__)
// Transposes a 16 x 16 block of bytes (rows `in_stride` apart) into 16 columns `out_stride` apart, in
// four rounds of interleaving 8-, 16-, 32- and 64-bit lanes.
inline void transpose_16x16(const std::byte* in, std::size_t in_stride, std::byte* out, std::size_t out_stride) {
  __m128i a[16], t[16], u[16], v[16];
  for (int i = 0; i < 16; ++i) a[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i * in_stride));
  for (int k = 0; k < 8; ++k) {  // t[2k]: bytes 0-7 of rows 2k, 2k+1 paired; t[2k+1]: bytes 8-15
    t[2 * k] = _mm_unpacklo_epi8(a[2 * k], a[2 * k + 1]);
    t[2 * k + 1] = _mm_unpackhi_epi8(a[2 * k], a[2 * k + 1]);
  }
  for (int m = 0; m < 4; ++m) {  // u[4m + q]: bytes 4q..4q+3, each with rows 4m..4m+3
    u[4 * m + 0] = _mm_unpacklo_epi16(t[4 * m], t[4 * m + 2]);
    u[4 * m + 1] = _mm_unpackhi_epi16(t[4 * m], t[4 * m + 2]);
    u[4 * m + 2] = _mm_unpacklo_epi16(t[4 * m + 1], t[4 * m + 3]);
    u[4 * m + 3] = _mm_unpackhi_epi16(t[4 * m + 1], t[4 * m + 3]);
  }
  for (int q = 0; q < 4; ++q) {  // v[4q + 0|1]: bytes 4q..4q+3 with rows 0-7; v[4q + 2|3]: rows 8-15
    v[4 * q + 0] = _mm_unpacklo_epi32(u[q], u[4 + q]);
    v[4 * q + 1] = _mm_unpackhi_epi32(u[q], u[4 + q]);
    v[4 * q + 2] = _mm_unpacklo_epi32(u[8 + q], u[12 + q]);
    v[4 * q + 3] = _mm_unpackhi_epi32(u[8 + q], u[12 + q]);
  }
  for (int q = 0; q < 4; ++q) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + (4 * q + 0) * out_stride), _mm_unpacklo_epi64(v[4 * q], v[4 * q + 2]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + (4 * q + 1) * out_stride), _mm_unpackhi_epi64(v[4 * q], v[4 * q + 2]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + (4 * q + 2) * out_stride), _mm_unpacklo_epi64(v[4 * q + 1], v[4 * q + 3]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + (4 * q + 3) * out_stride), _mm_unpackhi_epi64(v[4 * q + 1], v[4 * q + 3]));
  }
}
#endif

}  // namespace

void shuffle_records(const std::byte* in, std::size_t records, std::size_t record_bytes, std::size_t column, std::byte* out) {
  std::size_t row = 0;
#if defined(__SSE2__)
  // The shuffle costs a third of deflate's time done byte by byte; 16 x 16 blocks in SSE2 registers
  // make it a small share. Loads stay inside each record: the last partial 16 bytes go the slow way.
  const std::size_t block_bytes = record_bytes / 16 * 16;
  for (; row + 16 <= records; row += 16) {
    // The next 16 records, fetched while these are transposed: the records come from the caller's thread,
    // on another core, and the 16 rows' loads are 16 streams the hardware's prefetcher follows late.
    const std::byte* next = in + (row + 16) * record_bytes;
    const std::size_t next_bytes = std::min<std::size_t>(16, records - row - 16) * record_bytes;
    for (std::size_t b = 0; b < block_bytes; b += 16) {
      for (std::size_t k = b * 16; k < next_bytes && k < (b + 16) * 16; k += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(next + k), _MM_HINT_T0);
      }
      transpose_16x16(in + row * record_bytes + b, record_bytes, out + b * column + row, column);
    }
    shuffle_scalar(in, row, row + 16, block_bytes, record_bytes, column, out);
  }
#endif
  shuffle_scalar(in, row, records, 0, record_bytes, column, out);
}

void unshuffle_records(const std::byte* in, std::size_t column, std::size_t first, std::size_t records, std::size_t record_bytes,
                       std::byte* out) {
  std::size_t row = 0;
  // A transpose is its own inverse: the same 16 x 16 blocks, read from the columns, written to records.
#if defined(__SSE2__)
  const std::size_t block_bytes = record_bytes / 16 * 16;
  for (; row + 16 <= records; row += 16) {
    for (std::size_t b = 0; b < block_bytes; b += 16) {
      transpose_16x16(in + b * column + first + row, column, out + row * record_bytes + b, record_bytes);
    }
    for (std::size_t b = block_bytes; b < record_bytes; ++b) {
      const std::byte* c = in + b * column + first;
      for (std::size_t i = row; i < row + 16; ++i) out[i * record_bytes + b] = c[i];
    }
  }
#endif
  for (std::size_t b = 0; b < record_bytes; ++b) {
    const std::byte* c = in + b * column + first;
    for (std::size_t i = row; i < records; ++i) out[i * record_bytes + b] = c[i];
  }
}

namespace {

constexpr std::uint32_t kAdlerBase = 65521;
constexpr std::size_t kAdlerBlock = 5536;  // the largest multiple of 32 whose sums fit in 32 bits (zlib's NMAX)

#if defined(__x86_64__) && defined(__GNUC__)
// The bytes of whole 32-byte groups of `size` (the rest is left to adler32_of) in AVX2, on CPUs that have it (the
// build targets plain x86-64): 32 bytes a step, their weights 32 - k applied by one multiply-add of bytes, about a
// quarter of SSE2's instructions. Reading a trace spent a ninth of its instructions here (issue 37).
__attribute__((target("avx2"))) std::size_t adler32_avx2(std::uint64_t& s1, std::uint64_t& s2, const unsigned char* p,
                                                         std::size_t size) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i weights = _mm256_setr_epi8(32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14,
                                           13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1);
  std::size_t done = 0;
  while (size - done >= 32) {
    const std::size_t n = std::min(size - done, kAdlerBlock) / 32 * 32;
    // As the SSE2 loop below: s2 += n * s1 + 32 * (the sums of the earlier groups) + sum (32 - k) b_k per group.
    __m256i v_s1 = zero, v_prefix = zero, v_s2 = zero;
    for (std::size_t i = 0; i < n; i += 32) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + done + i));
      v_prefix = _mm256_add_epi32(v_prefix, v_s1);
      v_s1 = _mm256_add_epi32(v_s1, _mm256_sad_epu8(v, zero));
      v_s2 = _mm256_add_epi32(v_s2, _mm256_madd_epi16(_mm256_maddubs_epi16(v, weights), ones));
    }
    alignas(32) std::uint32_t a[8], b[8], c[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(a), v_s1);
    _mm256_store_si256(reinterpret_cast<__m256i*>(b), v_prefix);
    _mm256_store_si256(reinterpret_cast<__m256i*>(c), v_s2);
    std::uint64_t block_sum = 0, prefix = 0, weighted = 0;
    for (int k = 0; k < 8; k += 2) {  // _mm256_sad_epu8 fills the low half of each 64-bit lane
      block_sum += a[k];
      prefix += b[k];
    }
    for (int k = 0; k < 8; ++k) weighted += c[k];
    s2 = (s2 + n * s1 + 32 * prefix + weighted) % kAdlerBase;
    s1 = (s1 + block_sum) % kAdlerBase;
    done += n;
  }
  return done;
}

const bool kHaveAvx2 = __builtin_cpu_supports("avx2");
#endif

}  // namespace

// zlib's Adler-32 (RFC 1950) of `size` bytes, continuing from `adler`: zlib's own runs a byte at a time
// and took a tenth of a chunk's compression time; this one sums 32 bytes per step in AVX2 where the CPU has it,
// else 16 in SSE2.
std::uint32_t adler32_of(std::uint32_t adler, const std::byte* data, std::size_t size) {
  constexpr std::uint32_t kBase = kAdlerBase;
  constexpr std::size_t kBlock = kAdlerBlock;
  std::uint64_t s1 = adler & 0xFFFF, s2 = adler >> 16;
  const auto* p = reinterpret_cast<const unsigned char*>(data);
#if defined(__x86_64__) && defined(__GNUC__)
  if (kHaveAvx2) {
    const std::size_t done = adler32_avx2(s1, s2, p, size);
    p += done;
    size -= done;
  }
#endif
#if defined(__SSE2__)
  const __m128i zero = _mm_setzero_si128();
  const __m128i weights_lo = _mm_setr_epi16(16, 15, 14, 13, 12, 11, 10, 9);
  const __m128i weights_hi = _mm_setr_epi16(8, 7, 6, 5, 4, 3, 2, 1);
  while (size >= 16) {
    const std::size_t n = std::min(size, kBlock) / 16 * 16;
    // For the n bytes b_j of a block: s1 += sum b_j, s2 += n * s1 + sum (n - j) b_j. The weights n - j
    // split into 16 * (the sums of the earlier 16-byte groups) plus 16 - k within each group.
    __m128i v_s1 = zero, v_prefix = zero, v_s2 = zero;
    for (std::size_t i = 0; i < n; i += 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
      v_prefix = _mm_add_epi32(v_prefix, v_s1);
      v_s1 = _mm_add_epi32(v_s1, _mm_sad_epu8(v, zero));
      v_s2 = _mm_add_epi32(v_s2, _mm_madd_epi16(_mm_unpacklo_epi8(v, zero), weights_lo));
      v_s2 = _mm_add_epi32(v_s2, _mm_madd_epi16(_mm_unpackhi_epi8(v, zero), weights_hi));
    }
    alignas(16) std::uint32_t a[4], b[4], c[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(a), v_s1);
    _mm_store_si128(reinterpret_cast<__m128i*>(b), v_prefix);
    _mm_store_si128(reinterpret_cast<__m128i*>(c), v_s2);
    const std::uint64_t block_sum = std::uint64_t{a[0]} + a[2];  // _mm_sad_epu8 fills lanes 0 and 2
    const std::uint64_t prefix = std::uint64_t{b[0]} + b[2];
    const std::uint64_t weighted = std::uint64_t{c[0]} + c[1] + c[2] + c[3];
    s2 = (s2 + n * s1 + 16 * prefix + weighted) % kBase;
    s1 = (s1 + block_sum) % kBase;
    p += n;
    size -= n;
  }
#endif
  while (size > 0) {
    const std::size_t n = std::min(size, kBlock);
    for (std::size_t i = 0; i < n; ++i) {
      s1 += p[i];
      s2 += s1;
    }
    s1 %= kBase;
    s2 %= kBase;
    p += n;
    size -= n;
  }
  return static_cast<std::uint32_t>(s2 << 16 | s1);
}

namespace {

// The zlib header (RFC 1950) for a deflate stream at `level`: a 32 KiB window, the level's class, and
// the check bits that make the 16-bit header a multiple of 31.
void put_zlib_header(std::byte* out, int level) {
  const unsigned level_class = level == 1 ? 0 : level < 6 ? 1 : level == 6 ? 2 : 3;
  unsigned header = 0x78u << 8 | level_class << 6;
  header += 31 - header % 31;
  out[0] = static_cast<std::byte>(header >> 8);
  out[1] = static_cast<std::byte>(header & 0xFF);
}

void put_big_endian(std::byte* out, std::uint32_t value) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<std::byte>(value >> (24 - 8 * i));
}

std::uint32_t get_big_endian(const std::byte* in) {
  std::uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value = value << 8 | std::to_integer<std::uint32_t>(in[i]);
  return value;
}

}  // namespace

// One raw-deflate z_stream reused for every chunk (deflateReset, not an allocation per chunk). The zlib
// header and the Adler-32 trailer that HDF5's deflate filter expects around the data are written by
// encode(), with the faster checksum above.
struct ChunkCodec::Deflater {
  z_stream stream{};
  explicit Deflater(int level) {
    // memLevel 6 (zlib's default is 8): a quarter of the hash table, which zlib slides every 32 KiB of a
    // chunk (most of its time on the zeros of a partial chunk); 13% faster on trace chunks, as small.
    if (deflateInit2(&stream, level, Z_DEFLATED, -15, 6, Z_DEFAULT_STRATEGY) != Z_OK) {
      throw std::runtime_error("zlib deflateInit2 failed");
    }
  }
  ~Deflater() { deflateEnd(&stream); }
  Deflater(const Deflater&) = delete;
  Deflater& operator=(const Deflater&) = delete;
};

ChunkCodec::ChunkCodec(std::size_t record_bytes, std::size_t chunk_rows, int level, const std::vector<ByteRange>& run_length)
    : record_bytes_(record_bytes), chunk_rows_(chunk_rows), level_(level) {
  if (level_ == 0) return;
  shuffled_.resize(record_bytes_ * chunk_rows_);
  deflater_ = std::make_unique<Deflater>(level_);
  std::size_t at = 0;
  for (const ByteRange& r : run_length) {
    if (r.begin > at) regions_.push_back({at, r.begin, Z_DEFAULT_STRATEGY});
    if (r.end > r.begin) regions_.push_back({r.begin, r.end, Z_RLE, (r.end - r.begin) % 8 == 0});
    at = r.end;
  }
  if (at < record_bytes_) regions_.push_back({at, record_bytes_, Z_DEFAULT_STRATEGY});
}

ChunkCodec::~ChunkCodec() = default;

void ChunkCodec::encode(const std::byte* records, std::size_t rows, std::vector<std::byte>& out) {
  const std::size_t chunk_bytes = record_bytes_ * chunk_rows_;
  const std::size_t used = record_bytes_ * rows;
  if (level_ == 0) {
    out.resize(chunk_bytes);
    std::memcpy(out.data(), records, used);
    std::memset(out.data() + used, 0, chunk_bytes - used);
    return;
  }
  if (rows < chunk_rows_) std::memset(shuffled_.data(), 0, chunk_bytes);
  shuffle_records(records, rows, record_bytes_, chunk_rows_, shuffled_.data());

  // The stretches of the shuffled chunk and how each is deflated. A stored mantissa column of a partial
  // chunk stores its zeros too (the rows still to come): each change of setting ends a deflate block and
  // costs building its codes, more than copying the zeros; the chunk stays smaller than when full, since a
  // stored column takes a byte a row full or not.
  segments_.clear();
  for (const Region& r : regions_) {
    if (!r.mantissas) {
      add_segment(r.begin * chunk_rows_, (r.end - r.begin) * chunk_rows_, r.strategy);
      continue;
    }
    for (std::size_t b = r.begin; b < r.end; ++b) {
      const std::size_t at = b * chunk_rows_;
      if ((b - r.begin) % 8 < 6 && looks_random(shuffled_.data() + at, rows)) {
        add_segment(at, chunk_rows_, kStored);
      } else {
        add_segment(at, chunk_rows_, Z_RLE);
      }
    }
  }

  // The chunk goes out as one deflate stream made of pieces: zlib deflates each piece of its segments from a
  // fresh state (deflateReset), and the random-looking columns are written here as stored blocks between
  // them. A piece holds at most kPieceBytes of input, so zlib never slides its window and hash table (it does
  // every 32 KiB past the first 64 KiB: 8% of the writer's CPU), and stored bytes never pass through zlib,
  // which copied them into its window and hashed them for matches the run-length strategy never looks up.
  // A piece ends with a sync flush (zlib's block ended, an empty stored block that aligns the stream to a
  // byte); when stored columns follow, that empty block's LEN/NLEN become theirs, so a switch to stored
  // bytes costs what it did inside zlib. A piece that ends only because it is full costs the empty block
  // (5 bytes) and the history it forgets: a few bytes per 64 KiB of chunk.
  z_stream& z = deflater_->stream;
  std::size_t pieces = 1;
  for (const Segment& s : segments_) pieces += s.strategy == kStored ? 1 : s.size / kPieceBytes + 1;
  out.resize(deflateBound(&z, static_cast<uLong>(chunk_bytes)) + 1024 * (segments_.size() + pieces) + 6);
  put_zlib_header(out.data(), level_);
  std::size_t at = 2;          // the stream's end in `out`
  bool in_piece = false;       // zlib holds an unfinished piece
  bool aligned_empty = false;  // `out` ends with a sync flush's empty stored block (its LEN/NLEN the last 4 bytes)
  std::size_t piece_input = 0;
  int strategy = -2;           // the zlib strategy the piece now deflates with
  auto point_out = [&] {
    z.next_out = reinterpret_cast<Bytef*>(out.data() + at);
    z.avail_out = static_cast<uInt>(out.size() - 4 - at);  // 4: room for the Adler-32
  };
  auto run = [&](const std::byte* in, std::size_t size, int flush) {
    z.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(in));
    z.avail_in = static_cast<uInt>(size);
    point_out();
    const int status = deflate(&z, flush);
    if (status != (flush == Z_FINISH ? Z_STREAM_END : Z_OK) || z.avail_in != 0 || z.avail_out == 0) {
      throw std::runtime_error("zlib deflate failed with status " + std::to_string(status));
    }
    at = static_cast<std::size_t>(reinterpret_cast<std::byte*>(z.next_out) - out.data());
  };
  auto end_piece = [&] {
    run(nullptr, 0, Z_SYNC_FLUSH);
    // A sync flush ends with an empty stored block's LEN 0x0000 and NLEN 0xFFFF.
    if (at < 6 || out[at - 4] != std::byte{0} || out[at - 3] != std::byte{0} || out[at - 2] != std::byte{0xFF} ||
        out[at - 1] != std::byte{0xFF}) {
      throw std::logic_error("zlib's sync flush did not end with an empty stored block");
    }
    in_piece = false;
    aligned_empty = true;
  };
  for (const Segment& s : segments_) {
    if (s.strategy == kStored) {
      if (in_piece) end_piece();
      for (std::size_t done = 0; done < s.size;) {
        const std::size_t n = std::min<std::size_t>(s.size - done, 65535);
        if (at + 5 + n + 4 > out.size()) throw std::logic_error("ChunkCodec's output bound is too small");
        if (aligned_empty) {
          at -= 4;  // the empty block's header bits stay; its LEN/NLEN are rewritten
        } else {
          out[at++] = std::byte{0};  // BFINAL 0, BTYPE 00 (stored), padding to the byte
        }
        out[at++] = static_cast<std::byte>(n & 0xFF);
        out[at++] = static_cast<std::byte>(n >> 8);
        out[at++] = static_cast<std::byte>(~n & 0xFF);
        out[at++] = static_cast<std::byte>((~n >> 8) & 0xFF);
        std::memcpy(out.data() + at, shuffled_.data() + s.begin + done, n);
        at += n;
        done += n;
        aligned_empty = false;
      }
      continue;
    }
    for (std::size_t done = 0; done < s.size;) {
      if (!in_piece) {
        if (deflateReset(&z) != Z_OK) throw std::runtime_error("zlib deflateReset failed");
        in_piece = true;
        aligned_empty = false;
        piece_input = 0;
      }
      if (strategy != s.strategy) {
        point_out();  // a change of strategy ends zlib's block: its codes go out here
        if (deflateParams(&z, level_, s.strategy) != Z_OK) throw std::runtime_error("zlib deflateParams failed");
        at = static_cast<std::size_t>(reinterpret_cast<std::byte*>(z.next_out) - out.data());
        strategy = s.strategy;
      }
      const std::size_t left = s.size - done;
      std::size_t n = std::min(left, kPieceBytes - piece_input);
      // A full piece ends at a byte column's end where columns are short against a piece, so that no
      // column's run is cut in two.
      if (n < left && 4 * chunk_rows_ <= kPieceBytes) n = n / chunk_rows_ * chunk_rows_;
      if (n > 0) run(shuffled_.data() + s.begin + done, n, Z_NO_FLUSH);
      done += n;
      piece_input += n;
      if (done < s.size) end_piece();  // the piece is full
    }
  }
  if (in_piece) {
    run(nullptr, 0, Z_FINISH);
  } else {
    // After stored bytes: an empty final block with fixed codes (BFINAL 1, BTYPE 01, end of block). Not reached
    // with today's regions (a record's last byte column is never a stored mantissa byte), kept so any layout ends right.
    out[at++] = std::byte{0x03};
    out[at++] = std::byte{0x00};
  }
  put_big_endian(out.data() + at, adler32_of(1, shuffled_.data(), chunk_bytes));
  out.resize(at + 4);
}

// Appends a stretch, merged into the last one when it continues it with the same setting.
void ChunkCodec::add_segment(std::size_t begin, std::size_t size, int strategy) {
  if (size == 0) return;
  if (!segments_.empty() && segments_.back().strategy == strategy && segments_.back().begin + segments_.back().size == begin) {
    segments_.back().size += size;
    return;
  }
  segments_.push_back({begin, size, strategy});
}

// Whether `rows` bytes look like random ones to an order-0 coder, from their collision count (one pass, no
// logarithms): the sum of the squared byte counts is n + n (n - 1) / 256 on average for n random bytes,
// and within 2% of it at n = 1024; bytes whose sum exceeds that by more than 2^0.1 (Renyi entropy 0.1
// bit below random's) are left to deflate. Too few rows to tell (fewer than 256): no.
bool ChunkCodec::looks_random(const std::byte* column, std::size_t rows) const {
  if (rows < 256) return false;
  std::array<std::uint32_t, 256> counts{};
  for (std::size_t i = 0; i < rows; ++i) ++counts[std::to_integer<unsigned>(column[i])];
  std::uint64_t sum = 0;
  for (const std::uint32_t c : counts) sum += std::uint64_t{c} * c;
  const double n = static_cast<double>(rows);
  return static_cast<double>(sum) <= (n + n * (n - 1) / 256.0) * 1.072;
}

// One raw-inflate z_stream reused for every chunk (inflateReset). The zlib header and the Adler-32
// trailer are checked by ChunkDecoder itself: zlib's checksum runs a byte at a time, ours in SSE2.
struct ChunkDecoder::Inflater {
  z_stream stream{};
  bool ok = false;
  Inflater() { ok = inflateInit2(&stream, -15) == Z_OK; }
  ~Inflater() {
    if (ok) inflateEnd(&stream);
  }
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;
};

ChunkDecoder::ChunkDecoder(std::size_t record_bytes, std::size_t chunk_rows)
    : record_bytes_(record_bytes), chunk_rows_(chunk_rows), inflater_(std::make_unique<Inflater>()) {}

ChunkDecoder::~ChunkDecoder() = default;

bool ChunkDecoder::inflate(const std::byte* stored, std::size_t size) {
  return run(stored, size, record_bytes_ * chunk_rows_, true);
}

bool ChunkDecoder::inflate_prefix(const std::byte* stored, std::size_t size, std::size_t bytes) {
  return run(stored, size, std::min(bytes, record_bytes_ * chunk_rows_), false);
}

bool ChunkDecoder::run(const std::byte* stored, std::size_t size, std::size_t bytes, bool whole) {
  const std::size_t chunk_bytes = record_bytes_ * chunk_rows_;
  if (!inflater_->ok || size < 6 || chunk_bytes > std::numeric_limits<uInt>::max() ||
      size > std::numeric_limits<uInt>::max()) {
    return false;
  }
  // RFC 1950: deflate with a window of at most 32 KiB, no preset dictionary, header a multiple of 31.
  const unsigned cmf = std::to_integer<unsigned>(stored[0]), flg = std::to_integer<unsigned>(stored[1]);
  if ((cmf & 0x0F) != 8 || (cmf >> 4) > 7 || (flg & 0x20) != 0 || (cmf << 8 | flg) % 31 != 0) return false;
  if (shuffled_.size() < chunk_bytes) shuffled_.resize(chunk_bytes);
  z_stream& z = inflater_->stream;
  if (inflateReset(&z) != Z_OK) return false;
  z.next_in = const_cast<Bytef*>(reinterpret_cast<const Bytef*>(stored + 2));
  z.avail_in = static_cast<uInt>(size - 2);
  z.next_out = reinterpret_cast<Bytef*>(shuffled_.data());
  z.avail_out = static_cast<uInt>(bytes);
  const int status = ::inflate(&z, whole ? Z_FINISH : Z_SYNC_FLUSH);
  if (!whole) {
    // Stopped with the prefix filled, or at the stream's end exactly there (a chunk of one column).
    return z.total_out == bytes && (status == Z_OK || status == Z_BUF_ERROR || (status == Z_STREAM_END && bytes == chunk_bytes));
  }
  if (status != Z_STREAM_END || z.total_out != chunk_bytes || z.avail_in < 4) return false;
  return get_big_endian(reinterpret_cast<const std::byte*>(z.next_in)) == adler32_of(1, shuffled_.data(), chunk_bytes);
}

}  // namespace ampscope::trace::detail
