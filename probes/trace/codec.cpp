#include "probes/trace/codec.h"

#include <zlib.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <bit>
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

namespace {

// Deflate's bits (RFC 1951), least significant first, into `out` from byte `at`; whole bytes only leave on
// flush_bytes(), the last 0 to 7 bits stay in `buf`.
struct BitWriter {
  std::byte* out;
  std::size_t at;
  std::uint64_t buf = 0;
  unsigned n = 0;
  void put(std::uint32_t value, unsigned bits) {  // bits <= 32, value < 2^bits
    buf |= std::uint64_t{value} << n;
    n += bits;
    if (n >= 32) {
      for (int k = 0; k < 4; ++k) out[at++] = static_cast<std::byte>(buf >> (8 * k));
      buf >>= 32;
      n -= 32;
    }
  }
  void flush_bytes() {
    for (; n >= 8; n -= 8, buf >>= 8) out[at++] = static_cast<std::byte>(buf);
  }
};

// Huffman code lengths of at most `limit` bits for the symbols of `freq` (0 for those that never occur): a
// Huffman tree by the two-queue method; when it is deeper than `limit`, the counts are halved and it is built
// again. Two or more symbols give a complete code; one symbol gets a 1-bit code (deflate's rule).
void huffman_lengths(const std::uint32_t* freq, std::size_t count, unsigned limit, std::uint8_t* lengths) {  // count <= 286
  constexpr std::size_t kMost = 286;  // deflate's largest alphabet
  std::array<std::uint32_t, kMost> f{};
  std::array<std::pair<std::uint32_t, std::uint16_t>, kMost> leaves{};
  std::array<std::uint64_t, 2 * kMost> weight{};
  std::array<std::uint16_t, 2 * kMost> parent{};
  std::array<std::uint8_t, 2 * kMost> depth{};
  std::copy(freq, freq + count, f.begin());
  for (;;) {
    std::fill(lengths, lengths + count, std::uint8_t{0});
    std::size_t m = 0;
    for (std::size_t i = 0; i < count; ++i) {
      if (f[i] > 0) leaves[m++] = {f[i], static_cast<std::uint16_t>(i)};
    }
    if (m == 0) return;
    if (m == 1) {
      lengths[leaves[0].second] = 1;
      return;
    }
    std::sort(leaves.begin(), leaves.begin() + static_cast<std::ptrdiff_t>(m));
    // Nodes 0..m-1 are the leaves by weight, m.. the inner nodes in the order they are made (by weight too):
    // each parent comes after its children.
    for (std::size_t k = 0; k < m; ++k) weight[k] = leaves[k].first;
    std::size_t next_leaf = 0, next_inner = m, made = m;
    auto take = [&] {
      if (next_leaf < m && (next_inner >= made || weight[next_leaf] <= weight[next_inner])) return next_leaf++;
      return next_inner++;
    };
    for (; made < 2 * m - 1; ++made) {
      const std::size_t a = take(), b = take();
      weight[made] = weight[a] + weight[b];
      parent[a] = parent[b] = static_cast<std::uint16_t>(made);
    }
    depth[2 * m - 2] = 0;
    unsigned deepest = 0;
    for (std::size_t k = 2 * m - 2; k-- > 0;) {
      depth[k] = static_cast<std::uint8_t>(depth[parent[k]] + 1);
      if (k < m) deepest = std::max<unsigned>(deepest, depth[k]);
    }
    if (deepest <= limit) {
      for (std::size_t k = 0; k < m; ++k) lengths[leaves[k].second] = depth[k];
      return;
    }
    for (std::size_t i = 0; i < count; ++i) f[i] = f[i] == 0 ? 0 : (f[i] + 1) / 2;
  }
}

// The canonical codes of `lengths` (RFC 1951 3.2.2), bit-reversed for the writer's bit order.
void canonical_codes(const std::uint8_t* lengths, std::size_t count, std::uint16_t* codes) {
  std::array<std::uint16_t, 16> per_length{}, next{};
  for (std::size_t i = 0; i < count; ++i) ++per_length[lengths[i]];
  per_length[0] = 0;
  for (unsigned bits = 1, code = 0; bits < 16; ++bits) {
    code = (code + per_length[bits - 1]) << 1;
    next[bits] = static_cast<std::uint16_t>(code);
  }
  for (std::size_t i = 0; i < count; ++i) {
    const unsigned bits = lengths[i];
    if (bits == 0) continue;
    unsigned code = next[bits]++, reversed = 0;
    for (unsigned b = 0; b < bits; ++b, code >>= 1) reversed = reversed << 1 | (code & 1);
    codes[i] = static_cast<std::uint16_t>(reversed);
  }
}

// Deflate's extra bits after each length code 257..285.
constexpr std::uint8_t kLengthExtraBits[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2,
                                               3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};

// Deflate's length codes: for a match of 3..258 bytes, its symbol's offset from 257, extra bits and base.
struct LengthCodes {
  std::array<std::uint8_t, 259> code{}, extra{};
  std::array<std::uint16_t, 259> base{};
  LengthCodes() {
    constexpr std::uint16_t kBase[29] = {3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99,
                                         115, 131, 163, 195, 227, 258};
    for (unsigned c = 0; c < 29; ++c) {
      const unsigned last = c == 28 ? 258 : std::min<unsigned>(kBase[c] + (1u << kLengthExtraBits[c]) - 1, 257);
      for (unsigned length = kBase[c]; length <= last; ++length) {
        code[length] = static_cast<std::uint8_t>(c);
        extra[length] = kLengthExtraBits[c];
        base[length] = kBase[c];
      }
    }
  }
};
const LengthCodes kLengthCodes;

// Deflate's fixed codes (RFC 1951 3.2.6) for literals and lengths 0..285 (8, 9, 7 and 8 bits) and distance
// code 0 (5 bits), as lengths and bit-reversed codes laid out as RunLengthBlock's.
struct FixedCodes {
  std::array<std::uint8_t, 286 + 30> lengths{};
  std::array<std::uint16_t, 286 + 30> codes{};
  FixedCodes() {
    std::array<std::uint8_t, 288> literal{};
    std::array<std::uint16_t, 288> literal_codes{};
    for (unsigned c = 0; c < 288; ++c) literal[c] = c < 144 ? 8 : c < 256 ? 9 : c < 280 ? 7 : 8;
    canonical_codes(literal.data(), 288, literal_codes.data());
    std::copy(literal.begin(), literal.begin() + 286, lengths.begin());
    std::copy(literal_codes.begin(), literal_codes.begin() + 286, codes.begin());
    std::array<std::uint8_t, 30> distance{};
    distance.fill(5);
    std::array<std::uint16_t, 30> distance_codes{};
    canonical_codes(distance.data(), 30, distance_codes.data());
    std::copy(distance.begin(), distance.end(), lengths.begin() + 286);
    std::copy(distance_codes.begin(), distance_codes.end(), codes.begin() + 286);
  }
};
const FixedCodes kFixedCodes;

}  // namespace

// `size` bytes (size > 0) as one dynamic-Huffman deflate block, not the last, of literals and matches at distance 1
// of 3 to 258 bytes, as zlib's run-length strategy codes them, but without zlib's window copies, hashing and
// block ends every 4,095 symbols. `previous` is the stream's byte before `data` (-1: none, or not to be used).
// plan() codes the bytes and says how many bits the block takes; write() writes it into `w`, leaving the last
// 0 to 7 bits there.
struct ChunkCodec::RunLengthBlock {
  std::vector<std::uint16_t> symbols;
  std::array<std::uint8_t, 286 + 30> lengths{};
  std::array<std::uint16_t, 286 + 30> codes{};
  std::array<std::pair<std::uint8_t, std::uint8_t>, 286 + 30> header{};  // code-length symbol, extra value
  std::size_t header_count = 0, nlit = 0, ndist = 0, nclen = 0;
  bool fixed = false;  // deflate's fixed codes (lengths and codes hold them), no header
  std::array<std::uint8_t, 19> cl_lengths{};
  std::array<std::uint16_t, 19> cl_codes{};
  static constexpr std::uint8_t kOrder[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};
  static constexpr std::uint8_t kRepeatBits[3] = {2, 3, 7};

  // Codes `size` bytes (size > 0); returns the block's size in bits.
  std::uint64_t plan(const unsigned char* data, std::size_t size, int previous) {
    symbols.clear();
    header_count = 0;
    std::array<std::uint32_t, 286> litlen{};
    std::array<std::uint32_t, 30> dist{};
    for (std::size_t i = 0; i < size;) {
      std::size_t run = 0;
      if (previous >= 0) {
        const std::size_t most = std::min<std::size_t>(258, size - i);
        const std::uint64_t pattern = 0x0101010101010101ull * static_cast<unsigned>(previous);
        while (run + 8 <= most) {
          std::uint64_t word;
          std::memcpy(&word, data + i + run, 8);
          const std::uint64_t differ = word ^ pattern;
          if (differ != 0) {
            run += static_cast<std::size_t>(std::countr_zero(differ)) / 8;
            break;
          }
          run += 8;
        }
        if (run + 8 > most) {
          while (run < most && data[i + run] == previous) ++run;
        }
        run = std::min(run, most);
      }
      if (run >= 3) {
        symbols.push_back(static_cast<std::uint16_t>(256 + run));
        ++litlen[257 + kLengthCodes.code[run]];
        ++dist[0];
        i += run;
      } else {
        symbols.push_back(data[i]);
        ++litlen[data[i]];
        previous = data[i];
        ++i;
      }
    }
    ++litlen[256];
    huffman_lengths(litlen.data(), 286, 15, lengths.data());
    huffman_lengths(dist.data(), 30, 15, lengths.data() + 286);
    nlit = 286;
    ndist = 30;
    while (nlit > 257 && lengths[nlit - 1] == 0) --nlit;
    while (ndist > 1 && lengths[286 + ndist - 1] == 0) --ndist;
    // The code lengths of both codes as one sequence, run-length coded (16: the previous length 3-6 times more,
    // 17: 3-10 zeros, 18: 11-138 zeros).
    std::array<std::uint8_t, 286 + 30> sequence{};
    std::copy(lengths.begin(), lengths.begin() + static_cast<std::ptrdiff_t>(nlit), sequence.begin());
    std::copy(lengths.begin() + 286, lengths.begin() + 286 + static_cast<std::ptrdiff_t>(ndist),
              sequence.begin() + static_cast<std::ptrdiff_t>(nlit));
    const std::size_t total = nlit + ndist;
    std::array<std::uint32_t, 19> cl_freq{};
    auto emit = [&](unsigned symbol, unsigned extra) {
      header[header_count++] = {static_cast<std::uint8_t>(symbol), static_cast<std::uint8_t>(extra)};
      ++cl_freq[symbol];
    };
    for (std::size_t i = 0; i < total;) {
      const std::uint8_t value = sequence[i];
      std::size_t run = 1;
      while (i + run < total && sequence[i + run] == value) ++run;
      i += run;
      if (value == 0) {
        for (; run >= 11; run -= std::min<std::size_t>(run, 138))
          emit(18, static_cast<unsigned>(std::min<std::size_t>(run, 138) - 11));
        if (run >= 3) {
          emit(17, static_cast<unsigned>(run - 3));
          run = 0;
        }
        for (; run > 0; --run) emit(0, 0);
      } else {
        emit(value, 0);
        --run;
        for (; run >= 3; run -= std::min<std::size_t>(run, 6))
          emit(16, static_cast<unsigned>(std::min<std::size_t>(run, 6) - 3));
        for (; run > 0; --run) emit(value, 0);
      }
    }
    // inflate refuses an incomplete code-length code: with one symbol used, a second one (unused) completes it.
    if (std::count_if(cl_freq.begin(), cl_freq.end(), [](std::uint32_t c) { return c > 0; }) == 1) {
      ++cl_freq[cl_freq[0] == 0 ? 0 : 1];
    }
    huffman_lengths(cl_freq.data(), 19, 7, cl_lengths.data());
    canonical_codes(cl_lengths.data(), 19, cl_codes.data());
    nclen = 19;
    while (nclen > 4 && cl_lengths[kOrder[nclen - 1]] == 0) --nclen;
    canonical_codes(lengths.data(), 286, codes.data());
    canonical_codes(lengths.data() + 286, 30, codes.data() + 286);
    // Deflate's fixed codes instead, where they take fewer bits (short or even blocks: zlib chooses so too).
    // The length codes' extra bits, the same in both.
    std::uint64_t extra_bits = 0;
    for (unsigned c = 0; c < 29; ++c) extra_bits += std::uint64_t{litlen[257 + c]} * kLengthExtraBits[c];
    std::uint64_t fixed_bits = 3 + extra_bits;
    for (unsigned c = 0; c < 286; ++c) fixed_bits += std::uint64_t{litlen[c]} * kFixedCodes.lengths[c];
    fixed_bits += std::uint64_t{dist[0]} * 5;
    std::uint64_t bits = 3 + 5 + 5 + 4 + 3 * nclen;
    for (std::size_t k = 0; k < header_count; ++k) {
      const unsigned symbol = header[k].first;
      bits += cl_lengths[symbol] + (symbol >= 16 ? kRepeatBits[symbol - 16] : 0);
    }
    for (unsigned c = 0; c < 286; ++c) bits += std::uint64_t{litlen[c]} * lengths[c];
    bits += extra_bits + std::uint64_t{dist[0]} * lengths[286];
    fixed = fixed_bits < bits;
    if (fixed) {
      lengths = kFixedCodes.lengths;
      codes = kFixedCodes.codes;
      return fixed_bits;
    }
    return bits;
  }

  void write(BitWriter& w) const {
    w.put(0, 1);  // BFINAL 0
    if (fixed) {
      w.put(1, 2);  // BTYPE 01: fixed Huffman codes
    } else {
      w.put(2, 2);  // BTYPE 10: dynamic Huffman codes
      w.put(static_cast<std::uint32_t>(nlit - 257), 5);
      w.put(static_cast<std::uint32_t>(ndist - 1), 5);
      w.put(static_cast<std::uint32_t>(nclen - 4), 4);
      for (std::size_t k = 0; k < nclen; ++k) w.put(cl_lengths[kOrder[k]], 3);
      for (std::size_t k = 0; k < header_count; ++k) {
        const auto [symbol, extra] = header[k];
        w.put(cl_codes[symbol], cl_lengths[symbol]);
        if (symbol >= 16) w.put(extra, kRepeatBits[symbol - 16]);
      }
    }
    const std::uint32_t distance_code = codes[286];
    const unsigned distance_bits = lengths[286];
    for (const std::uint16_t symbol : symbols) {
      if (symbol < 256) {
        w.put(codes[symbol], lengths[symbol]);
        continue;
      }
      const unsigned length = symbol - 256;
      const unsigned code = 257 + kLengthCodes.code[length];
      w.put(codes[code], lengths[code]);
      if (kLengthCodes.extra[length] > 0) w.put(length - kLengthCodes.base[length], kLengthCodes.extra[length]);
      w.put(distance_code, distance_bits);  // distance 1: code 0, no extra bits
    }
    w.put(codes[256], lengths[256]);  // end of block
    w.flush_bytes();
  }
};

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
  run_length_ = std::make_unique<RunLengthBlock>();
  std::size_t at = 0;
  for (const ByteRange& r : run_length) {
    if (r.begin > at) regions_.push_back({at, r.begin, Z_DEFAULT_STRATEGY});
    if (r.end > r.begin) regions_.push_back({r.begin, r.end, Z_RLE, (r.end - r.begin) % 8 == 0});
    at = r.end;
  }
  if (at < record_bytes_) regions_.push_back({at, record_bytes_, Z_DEFAULT_STRATEGY});
}

ChunkCodec::~ChunkCodec() = default;

void ChunkCodec::encode(const std::byte* records, std::size_t rows, std::vector<std::byte>& out, std::size_t partial_budget) {
  const std::size_t chunk_bytes = record_bytes_ * chunk_rows_;
  const std::size_t used = record_bytes_ * rows;
  if (level_ == 0) {
    out.resize(chunk_bytes);
    std::memcpy(out.data(), records, used);
    std::memset(out.data() + used, 0, chunk_bytes - used);
    return;
  }
  const bool partial = rows < chunk_rows_;
  if (partial && partial_budget > 0 && chunk_rows_ < kOwnRunLengthRows) {
    // The columns' zeros beyond `rows` are not written: encode_fixed_runs codes them without reading them.
    shuffle_records(records, rows, record_bytes_, chunk_rows_, shuffled_.data());
    if (encode_fixed_runs(rows, partial_budget, out)) return;
    for (std::size_t b = 0; b < record_bytes_; ++b) std::memset(shuffled_.data() + b * chunk_rows_ + rows, 0, chunk_rows_ - rows);
  } else {
    if (partial) std::memset(shuffled_.data(), 0, chunk_bytes);
    shuffle_records(records, rows, record_bytes_, chunk_rows_, shuffled_.data());
  }

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
  // (5 bytes) and the history it forgets: a few bytes per 64 KiB of chunk. The run-length stretches are
  // coded here too (RunLengthBlock: zlib spent a quarter of a chunk's time on them, copying, scanning and
  // ending a block every 4,095 symbols), spliced to zlib's pieces bit for bit (Z_BLOCK, deflatePrime).
  // A run-length stretch gets a block, with its own codes, every kRunLengthColumns byte columns: the byte
  // columns of a double differ (a sign and exponent byte, mantissa bytes of f16 values), so codes fitted to
  // a few columns take fewer bytes than one code for the stretch, more than their headers cost. Chunks of
  // fewer than kOwnRunLengthRows rows leave them to zlib, in its piece: there the blocks' headers and the
  // history a new piece forgets (the columns after them match earlier ones) cost more than they save
  // (30-step traces of the MLP and CNN samples, 128-row chunks: 2.6% and 6-9% larger).
  const bool own_run_length = chunk_rows_ >= kOwnRunLengthRows;
  if (own_run_length) {
    const std::size_t slice = kRunLengthColumns * chunk_rows_;
    std::vector<Segment> sliced;
    for (const Segment& s : segments_) {
      if (s.strategy != Z_RLE) {
        sliced.push_back(s);
        continue;
      }
      for (std::size_t done = 0; done < s.size; done += slice) sliced.push_back({s.begin + done, std::min(slice, s.size - done), Z_RLE});
    }
    segments_.swap(sliced);
  }
  z_stream& z = deflater_->stream;
  std::size_t pieces = 1;
  for (const Segment& s : segments_) pieces += s.strategy == kStored ? 1 : s.size / kPieceBytes + 1;
  out.resize(deflateBound(&z, static_cast<uLong>(chunk_bytes)) + 1024 * (segments_.size() + pieces) + 6);
  put_zlib_header(out.data(), level_);
  std::size_t at = 2;          // the stream's whole bytes in `out`
  bool in_piece = false;       // zlib holds an unfinished piece
  bool aligned_empty = false;  // `out` ends with a sync flush's empty stored block (its LEN/NLEN the last 4 bytes)
  // Outside a piece, the stream's last 0 to 7 bits, not yet in `out` (after a run-length block of the codec's).
  unsigned tail_bits = 0;
  std::uint64_t tail = 0;
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
  auto writer = [&] {
    BitWriter w{out.data(), at, tail, tail_bits};
    tail_bits = 0;
    tail = 0;
    aligned_empty = false;
    return w;
  };
  for (const Segment& s : segments_) {
    bool store = s.strategy == kStored;
    std::uint64_t planned_bits = 0;
    if (s.strategy == Z_RLE && own_run_length) {
      // The codec's own run-length block (see RunLengthBlock), or stored blocks where those take fewer bits
      // (zlib too stores a block its codes would make larger). After zlib's piece, zlib's block is ended
      // (Z_BLOCK) and up to 7 of its bits are still in zlib: the block's first bits complete that byte through
      // deflatePrime, so no empty stored block is needed between them.
      RunLengthBlock& block = *run_length_;
      const int previous = s.begin > 0 ? std::to_integer<int>(shuffled_[s.begin - 1]) : -1;
      planned_bits = block.plan(reinterpret_cast<const unsigned char*>(shuffled_.data() + s.begin), s.size, previous);
      store = planned_bits > 8 * (s.size + 5 * ((s.size + 65534) / 65535)) + 8;
    }
    if (s.strategy == Z_RLE && own_run_length && !store) {
      const RunLengthBlock& block = *run_length_;
      if (at + planned_bits / 8 + 16 > out.size()) throw std::logic_error("ChunkCodec's output bound is too small");
      unsigned zlib_bits = 0;
      if (in_piece) {
        run(nullptr, 0, Z_BLOCK);
        unsigned pending = 0;
        int bits = 0;
        if (deflatePending(&z, &pending, &bits) != Z_OK || pending != 0 || bits < 0 || bits > 7) {
          throw std::logic_error("zlib kept whole bytes after Z_BLOCK");
        }
        zlib_bits = static_cast<unsigned>(bits);
        in_piece = false;
      }
      BitWriter w = writer();
      w.n = std::max(w.n, zlib_bits);  // zlib's bits, as zeros for now (tail_bits is 0 after a piece)
      block.write(w);
      if (zlib_bits > 0) {
        // The first byte holds zlib's bits (zeros here) and the block's first 8 - zlib_bits bits.
        const std::size_t first = at;
        const unsigned ours = std::to_integer<unsigned>(out[first]) >> zlib_bits;
        if (deflatePrime(&z, static_cast<int>(8 - zlib_bits), static_cast<int>(ours)) != Z_OK) {
          throw std::logic_error("zlib deflatePrime failed");
        }
        const std::byte second = w.at > first + 1 ? out[first + 1] : std::byte{0};
        point_out();
        z.avail_out = 1;  // zlib writes just the completed byte
        if (deflate(&z, Z_NO_FLUSH) != Z_OK || reinterpret_cast<std::byte*>(z.next_out) != out.data() + first + 1) {
          throw std::logic_error("zlib did not give back the byte deflatePrime completed");
        }
        if (w.at > first + 1 && out[first + 1] != second) throw std::logic_error("zlib wrote past the completed byte");
      }
      at = w.at;
      tail_bits = w.n;
      tail = w.buf;
      continue;
    }
    if (store) {
      if (in_piece) end_piece();
      for (std::size_t done = 0; done < s.size;) {
        const std::size_t n = std::min<std::size_t>(s.size - done, 65535);
        if (at + 5 + n + 4 + 1 > out.size()) throw std::logic_error("ChunkCodec's output bound is too small");
        if (aligned_empty) {
          at -= 4;  // the empty block's header bits stay; its LEN/NLEN are rewritten
        } else {
          // BFINAL 0, BTYPE 00 (stored), padding to the byte: after the stream's last bits, if any.
          BitWriter w = writer();
          w.put(0, 3);
          w.put(0, (8 - w.n % 8) % 8);
          w.flush_bytes();
          at = w.at;
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
        // The stream's last bits (a run-length block's) go first, through zlib's own bit buffer.
        if (tail_bits > 0 && deflatePrime(&z, static_cast<int>(tail_bits), static_cast<int>(tail)) != Z_OK) {
          throw std::logic_error("zlib deflatePrime failed");
        }
        tail_bits = 0;
        tail = 0;
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
    // After stored bytes or a run-length block: an empty final block with fixed codes (BFINAL 1, BTYPE 01, end
    // of block), then the padding to the byte.
    BitWriter w = writer();
    w.put(1, 1);
    w.put(1, 2);
    w.put(0, 7);
    w.put(0, (8 - w.n % 8) % 8);
    w.flush_bytes();
    at = w.at;
  }
  put_big_endian(out.data() + at, adler32_of(1, shuffled_.data(), chunk_bytes));
  out.resize(at + 4);
}

// One final block of deflate's fixed codes (RFC 1951 3.2.6): each byte column's first `rows` bytes as literals,
// runs at distance 1 of 3 to 258 bytes (the byte before repeated, as zlib's run-length strategy finds them) and
// matches of 4 to 258 bytes at the last position whose 3 bytes hashed alike (a text id's column repeats a step's
// ids: without them the MLP's 128-row /ops chunk took 4,164 bytes at 110 rows, over its 3,008-byte budget; with
// them 2,968), then the column's chunk_rows - rows zeros as runs (after one literal zero when the byte before is
// not zero). A fixed
// code needs no counts and no code building, which were most of zlib's time on a short step's partial chunk (in
// the writer, not in a loop over one chunk: building a code branches on the counts), and the zeros cost a run per
// 258 bytes instead of zlib's scan of every byte. The Adler-32 is that of the whole shuffled chunk: each column's
// bytes, then its zeros added arithmetically (n zeros leave s1 and add n * s1 to s2).
bool ChunkCodec::encode_fixed_runs(std::size_t rows, std::size_t budget, std::vector<std::byte>& out) {
  const std::size_t zeros = chunk_rows_ - rows;
  // Room for the budget (or the whole stream's worst case, a literal of at most 9 bits a byte, when that is less),
  // plus one column's worst case past it before the check, and the BitWriter's 4-byte stores.
  out.resize(std::min(budget, record_bytes_ * chunk_rows_ * 9 / 8 + 16) + 2 * chunk_rows_ + 64);
  put_zlib_header(out.data(), level_);
  BitWriter w{out.data(), 2};
  w.put(1, 1);  // BFINAL 1: the only block
  w.put(1, 2);  // BTYPE 01: fixed codes
  const auto& lengths = kFixedCodes.lengths;
  const auto& codes = kFixedCodes.codes;
  int previous = -1;     // the stream's last byte (none yet)
  std::size_t held = 0;  // bytes equal to `previous` that follow it, not written yet: a run may go on past a column
  // The held bytes as runs of at most 258, the last 1 or 2 as literals.
  auto write_held = [&] {
    for (; held >= 3; held -= std::min<std::size_t>(held, 258)) {
      const std::size_t length = std::min<std::size_t>(held, 258);
      const unsigned code = 257 + kLengthCodes.code[length];
      w.put(codes[code], lengths[code]);
      if (kLengthCodes.extra[length] > 0) w.put(static_cast<std::uint32_t>(length - kLengthCodes.base[length]), kLengthCodes.extra[length]);
      w.put(codes[286], lengths[286]);  // distance 1: code 0, no extra bits
    }
    for (; held > 0; --held) w.put(codes[previous], lengths[previous]);
  };
  auto literal = [&](unsigned byte) {
    write_held();
    w.put(codes[byte], lengths[byte]);
    previous = static_cast<int>(byte);
  };
  std::uint32_t adler = 1;
  const auto* shuffled = reinterpret_cast<const unsigned char*>(shuffled_.data());
  std::fill(match_head.begin(), match_head.end(), kNoCandidate);
  for (std::size_t b = 0; b < record_bytes_; ++b) {
    const unsigned char* column = shuffled + b * chunk_rows_;
    for (std::size_t i = 0; i < rows;) {
      std::size_t run = 0;
      if (previous >= 0) {
        const std::uint64_t pattern = 0x0101010101010101ull * static_cast<unsigned>(previous);
        while (run + 8 <= rows - i) {
          std::uint64_t word;
          std::memcpy(&word, column + i + run, 8);
          const std::uint64_t differ = word ^ pattern;
          if (differ != 0) {
            run += static_cast<std::size_t>(std::countr_zero(differ)) / 8;
            break;
          }
          run += 8;
        }
        if (run + 8 > rows - i) {
          while (i + run < rows && column[i + run] == previous) ++run;
        }
      }
      if (run >= 3 || (run > 0 && i + 3 > rows)) {
        held += run;
        i += run;
        continue;
      }
      // A match further back: the last position whose next 3 bytes hashed alike (no chains; not the zeros, whose
      // stream bytes shuffled_ does not hold), within the candidate's column's rows and 32 KiB.
      std::size_t length = 0, distance = 0;
      if (i + 3 <= rows) {
        const std::size_t at = b * chunk_rows_ + i;
        const std::uint32_t key = static_cast<std::uint32_t>(column[i]) | static_cast<std::uint32_t>(column[i + 1]) << 8 |
                                  static_cast<std::uint32_t>(column[i + 2]) << 16;
        const std::uint32_t slot = (key * 2654435761u) >> (32 - kMatchHashBits);
        const std::uint32_t candidate = match_head[slot];
        match_head[slot] = static_cast<std::uint32_t>(at);
        if (candidate != kNoCandidate && at - candidate <= 32768) {
          const std::size_t candidate_end = candidate / chunk_rows_ * chunk_rows_ + rows;
          const std::size_t most = std::min({rows - i, candidate_end - candidate, std::size_t{258}});
          const unsigned char* p = shuffled + candidate;
          const unsigned char* q = column + i;
          while (length + 8 <= most) {
            std::uint64_t x, y;
            std::memcpy(&x, p + length, 8);
            std::memcpy(&y, q + length, 8);
            if (x != y) {
              length += static_cast<std::size_t>(std::countr_zero(x ^ y)) / 8;
              break;
            }
            length += 8;
          }
          if (length + 8 > most) {
            while (length < most && p[length] == q[length]) ++length;
          }
          length = std::min(length, most);
          distance = at - candidate;
        }
      }
      if (length >= 4 && length > run) {
        write_held();
        const unsigned code = 257 + kLengthCodes.code[length];
        w.put(codes[code], lengths[code]);
        if (kLengthCodes.extra[length] > 0) w.put(static_cast<std::uint32_t>(length - kLengthCodes.base[length]), kLengthCodes.extra[length]);
        // Distance code and extra bits (RFC 1951 3.2.5): d - 1 below 4 is its own code; else its top two bits and
        // its length give the code, the bits below them are the extra bits.
        const std::uint32_t x = static_cast<std::uint32_t>(distance - 1);
        if (x < 4) {
          w.put(codes[286 + x], lengths[286 + x]);
        } else {
          const unsigned top = static_cast<unsigned>(std::bit_width(x)) - 1;  // x >= 4: top >= 2
          const unsigned d = 2 * top + ((x >> (top - 1)) & 1);
          w.put(codes[286 + d], lengths[286 + d]);
          w.put(x & ((1u << (top - 1)) - 1), top - 1);
        }
        previous = column[i + length - 1];
        i += length;
      } else if (run > 0) {
        held += run;
        i += run;
      } else {
        literal(column[i]);
        ++i;
      }
    }
    if (zeros > 0) {  // the rows still to come
      std::size_t n = zeros;
      if (previous != 0) {
        literal(0);
        --n;
      }
      held += n;
    }
    if (w.at > budget) return false;
    adler = adler32_of(adler, shuffled_.data() + b * chunk_rows_, rows);
    const std::uint64_t s1 = adler & 0xFFFF, s2 = adler >> 16;
    adler = static_cast<std::uint32_t>((s2 + zeros % kAdlerBase * s1) % kAdlerBase << 16 | s1);
  }
  write_held();
  w.put(codes[256], lengths[256]);  // end of block
  w.put(0, (8 - w.n % 8) % 8);
  w.flush_bytes();
  if (w.at + 4 > budget) return false;
  put_big_endian(out.data() + w.at, adler);
  out.resize(w.at + 4);
  return true;
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
