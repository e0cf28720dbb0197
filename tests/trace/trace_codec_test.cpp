// The writer's own chunk compression must produce exactly what HDF5's shuffle + deflate filters decode:
// checked against zlib itself (uncompress, which verifies the Adler-32 trailer, and zlib's adler32) and
// a byte-by-byte transpose written here. The reader's ChunkDecoder undoes it: what the codec and zlib
// itself encode comes back, and bytes that are not such a chunk are refused, never decoded wrongly.
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "probes/trace/codec.h"

namespace ampscope::trace::detail {
namespace {

std::vector<std::byte> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<std::byte> v(n);
  // Mostly small values with some noise: compressible like trace records, not trivially so.
  for (auto& b : v) b = static_cast<std::byte>(gen() % 7 == 0 ? gen() : gen() % 4);
  return v;
}

// HDF5's shuffle of a chunk of `column` records of which the first `records` are given (the rest zero).
std::vector<std::byte> reference_shuffle(const std::vector<std::byte>& in, std::size_t records, std::size_t record_bytes,
                                         std::size_t column) {
  std::vector<std::byte> out(record_bytes * column, std::byte{0});
  for (std::size_t i = 0; i < records; ++i) {
    for (std::size_t b = 0; b < record_bytes; ++b) out[b * column + i] = in[i * record_bytes + b];
  }
  return out;
}

// `stored`, a chunk's bytes, is one whole zlib stream (uncompress2: every byte consumed, its Adler-32 checked) that
// inflates to the shuffled chunk of the first `rows` records (zeros beyond them; a buffer one byte longer shows a
// longer stream), and the reader's decoder gives those records back.
void expect_inflates_to_chunk(const std::vector<std::byte>& stored, const std::vector<std::byte>& records, std::size_t rows,
                              std::size_t record_bytes, std::size_t chunk_rows, ChunkDecoder& decoder, const std::string& what) {
  std::vector<std::byte> decoded(record_bytes * chunk_rows + 1);
  uLongf size = static_cast<uLongf>(decoded.size());
  uLong consumed = static_cast<uLong>(stored.size());
  ASSERT_EQ(uncompress2(reinterpret_cast<Bytef*>(decoded.data()), &size, reinterpret_cast<const Bytef*>(stored.data()), &consumed),
            Z_OK)
      << what;
  ASSERT_EQ(consumed, stored.size()) << what;
  ASSERT_EQ(size, record_bytes * chunk_rows) << what;
  decoded.resize(size);
  ASSERT_EQ(decoded, reference_shuffle(records, rows, record_bytes, chunk_rows)) << what;
  ASSERT_TRUE(decoder.inflate(stored.data(), stored.size())) << what;
  std::vector<std::byte> back(rows * record_bytes);
  decoder.unshuffle(0, rows, back.data());
  ASSERT_EQ(std::memcmp(back.data(), records.data(), back.size()), 0) << what;
}

TEST(trace_codec_test, shuffles_records_as_hdf5s_shuffle_filter) {
  for (std::size_t record_bytes : {1, 8, 15, 16, 17, 75, 445}) {
    for (std::size_t records : {1, 15, 16, 17, 100, 1024}) {
      const std::size_t column = records + 5;  // a partial chunk leaves room after each column
      const std::vector<std::byte> in = random_bytes(records * record_bytes, static_cast<unsigned>(records * 31 + record_bytes));
      std::vector<std::byte> out(record_bytes * column, std::byte{0});
      shuffle_records(in.data(), records, record_bytes, column, out.data());
      EXPECT_EQ(out, reference_shuffle(in, records, record_bytes, column)) << record_bytes << "-byte records, " << records << " records";
    }
  }
}

TEST(trace_codec_test, computes_zlibs_adler32) {
  const std::vector<std::byte> data = random_bytes(200000, 3);
  // Around the SSE2 (16 bytes) and AVX2 (32 bytes) steps and the blocks between reductions (5536 bytes).
  for (std::size_t n : {0, 1, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65, 5535, 5536, 5537, 5552, 5567, 5568, 5569, 11072,
                        11073, 100000, 199999, 200000}) {
    const auto expected = static_cast<std::uint32_t>(adler32(1, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(n)));
    EXPECT_EQ(adler32_of(1, data.data(), n), expected) << n << " bytes";
  }
  std::vector<std::byte> ones(100017, std::byte{0xFF});  // the largest sums
  EXPECT_EQ(adler32_of(1, ones.data(), ones.size()),
            static_cast<std::uint32_t>(adler32(1, reinterpret_cast<const Bytef*>(ones.data()), static_cast<uInt>(ones.size()))));
  const std::uint32_t first = adler32_of(1, data.data(), 1000);
  EXPECT_EQ(adler32_of(first, data.data() + 1000, 5000),
            static_cast<std::uint32_t>(adler32(1, reinterpret_cast<const Bytef*>(data.data()), 6000)));
}

TEST(trace_codec_test, encodes_full_and_partial_chunks_that_zlib_decodes) {
  constexpr std::size_t kRecordBytes = 45, kChunkRows = 200;
  const std::vector<std::byte> records = random_bytes(kRecordBytes * kChunkRows, 11);
  for (int level : {1, 4, 9}) {
    ChunkCodec codec(kRecordBytes, kChunkRows, level, {{8, 24}, {40, 45}});
    for (std::size_t rows : {kChunkRows, std::size_t{1}, std::size_t{77}}) {
      std::vector<std::byte> stored;
      codec.encode(records.data(), rows, stored);
      std::vector<std::byte> decoded(kRecordBytes * kChunkRows);
      uLongf size = static_cast<uLongf>(decoded.size());
      ASSERT_EQ(uncompress(reinterpret_cast<Bytef*>(decoded.data()), &size, reinterpret_cast<const Bytef*>(stored.data()),
                           static_cast<uLong>(stored.size())),
                Z_OK)
          << "level " << level << ", " << rows << " rows";
      ASSERT_EQ(size, decoded.size());
      EXPECT_EQ(decoded, reference_shuffle(records, rows, kRecordBytes, kChunkRows)) << "level " << level << ", " << rows << " rows";
      EXPECT_LT(stored.size(), decoded.size());
    }
  }
}

// Records like /ops': two small counters, then four f64 statistics whose mantissas look random (drawn from
// a uniform distribution) or, in `constant`, the same value on every row (mantissa bytes all alike).
std::vector<std::byte> statistics_records(std::size_t rows, bool constant, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> uniform(0.5, 4.0);
  std::vector<std::byte> out(rows * 48);
  for (std::size_t i = 0; i < rows; ++i) {
    const std::int64_t counters[2] = {static_cast<std::int64_t>(i / 100), static_cast<std::int64_t>(i % 100)};
    std::memcpy(out.data() + i * 48, counters, 16);
    for (int k = 0; k < 4; ++k) {
      const double v = constant ? 1.25 * (k + 1) : uniform(gen);
      std::memcpy(out.data() + i * 48 + 16 + 8 * k, &v, 8);
    }
  }
  return out;
}

// A chunk of at least 256 rows puts the mantissa columns that look random in stored deflate blocks: zlib (what
// HDF5's filter calls) and the ChunkDecoder read the stream back exactly, full or partial, and it is no larger
// than with every float column run-length coded (the ranges below that are not whole f64 fields keep that).
TEST(trace_codec_test, stores_random_mantissa_columns_and_zlib_decodes_them) {
  constexpr std::size_t kRecordBytes = 48, kChunkRows = 1024;
  for (const bool constant : {false, true}) {
    const std::vector<std::byte> records = statistics_records(kChunkRows, constant, 41);
    ChunkCodec codec(kRecordBytes, kChunkRows, 1, {{16, 48}});
    ChunkCodec run_length_only(kRecordBytes, kChunkRows, 1, {{16, 47}, {47, 48}});
    ChunkDecoder decoder(kRecordBytes, kChunkRows);
    for (std::size_t rows : {kChunkRows, std::size_t{700}, std::size_t{256}, std::size_t{255}, std::size_t{1}}) {
      std::vector<std::byte> stored, reference;
      codec.encode(records.data(), rows, stored);
      run_length_only.encode(records.data(), rows, reference);
      std::vector<std::byte> decoded(kRecordBytes * kChunkRows);
      uLongf size = static_cast<uLongf>(decoded.size());
      ASSERT_EQ(uncompress(reinterpret_cast<Bytef*>(decoded.data()), &size, reinterpret_cast<const Bytef*>(stored.data()),
                           static_cast<uLong>(stored.size())),
                Z_OK)
          << rows << " rows, constant " << constant;
      ASSERT_EQ(size, decoded.size());
      EXPECT_EQ(decoded, reference_shuffle(records, rows, kRecordBytes, kChunkRows)) << rows << " rows";
      ASSERT_TRUE(decoder.inflate(stored.data(), stored.size())) << rows << " rows";
      std::vector<std::byte> out(rows * kRecordBytes);
      decoder.unshuffle(0, rows, out.data());
      EXPECT_EQ(out, std::vector<std::byte>(records.begin(), records.begin() + static_cast<std::ptrdiff_t>(rows * kRecordBytes)));
      if (rows == kChunkRows) {
        // Stored blocks cost a byte a byte: 24 of the 48 bytes of a random row (6 of each f64), a little less
        // than Huffman codes give random bytes; constant values compress to almost nothing either way.
        EXPECT_LE(stored.size(), reference.size()) << "constant " << constant;
        if (constant) {
          EXPECT_LT(stored.size(), kChunkRows);
        } else {
          EXPECT_GE(stored.size(), 24 * kChunkRows);
        }
      }
    }
  }
}

TEST(trace_codec_test, stores_raw_chunks_padded_with_zero_records_at_level_zero) {
  constexpr std::size_t kRecordBytes = 9, kChunkRows = 10;
  const std::vector<std::byte> records = random_bytes(kRecordBytes * kChunkRows, 5);
  ChunkCodec codec(kRecordBytes, kChunkRows, 0);
  std::vector<std::byte> stored;
  codec.encode(records.data(), 4, stored);
  ASSERT_EQ(stored.size(), kRecordBytes * kChunkRows);
  EXPECT_EQ(std::memcmp(stored.data(), records.data(), 4 * kRecordBytes), 0);
  for (std::size_t i = 4 * kRecordBytes; i < stored.size(); ++i) EXPECT_EQ(stored[i], std::byte{0});
}

TEST(trace_codec_test, unshuffles_any_run_of_records_of_a_chunk) {
  for (std::size_t record_bytes : {1, 8, 15, 16, 17, 445}) {
    constexpr std::size_t kColumn = 100;
    const std::vector<std::byte> records = random_bytes(kColumn * record_bytes, static_cast<unsigned>(record_bytes));
    const std::vector<std::byte> shuffled = reference_shuffle(records, kColumn, record_bytes, kColumn);
    for (auto [first, count] : {std::pair<std::size_t, std::size_t>{0, 100}, {0, 1}, {3, 16}, {7, 33}, {50, 50}, {99, 1}, {20, 0}}) {
      std::vector<std::byte> out(count * record_bytes, std::byte{0x5A});
      unshuffle_records(shuffled.data(), kColumn, first, count, record_bytes, out.data());
      const std::vector<std::byte> expected(records.begin() + static_cast<std::ptrdiff_t>(first * record_bytes),
                                            records.begin() + static_cast<std::ptrdiff_t>((first + count) * record_bytes));
      EXPECT_EQ(out, expected) << record_bytes << "-byte records " << first << ".." << first + count;
    }
  }
}

TEST(trace_codec_test, decodes_chunks_the_codec_and_zlib_encode) {
  constexpr std::size_t kRecordBytes = 45, kChunkRows = 200;
  const std::vector<std::byte> records = random_bytes(kRecordBytes * kChunkRows, 17);
  ChunkDecoder decoder(kRecordBytes, kChunkRows);
  for (std::size_t rows : {kChunkRows, std::size_t{77}}) {
    // The codec's own stream, followed by the zero padding the writer adds to chunks it rewrites.
    ChunkCodec codec(kRecordBytes, kChunkRows, 1, {{8, 24}});
    std::vector<std::byte> stored;
    codec.encode(records.data(), rows, stored);
    stored.resize(stored.size() + 300, std::byte{0});
    ASSERT_TRUE(decoder.inflate(stored.data(), stored.size())) << rows << " rows";
    std::vector<std::byte> out(rows * kRecordBytes);
    decoder.unshuffle(0, rows, out.data());
    EXPECT_EQ(out, std::vector<std::byte>(records.begin(), records.begin() + static_cast<std::ptrdiff_t>(rows * kRecordBytes)));
  }
  // zlib's compress2 (what HDF5's deflate filter calls) at level 9 on a shuffled chunk.
  const std::vector<std::byte> shuffled = reference_shuffle(records, kChunkRows, kRecordBytes, kChunkRows);
  std::vector<std::byte> stored(compressBound(static_cast<uLong>(shuffled.size())));
  uLongf size = static_cast<uLongf>(stored.size());
  ASSERT_EQ(compress2(reinterpret_cast<Bytef*>(stored.data()), &size, reinterpret_cast<const Bytef*>(shuffled.data()),
                      static_cast<uLong>(shuffled.size()), 9),
            Z_OK);
  stored.resize(size);
  ASSERT_TRUE(decoder.inflate(stored.data(), stored.size()));
  EXPECT_EQ(std::memcmp(decoder.shuffled(), shuffled.data(), shuffled.size()), 0);
  // The first byte columns alone: the first field of every record.
  ASSERT_TRUE(decoder.inflate_prefix(stored.data(), stored.size(), 8 * kChunkRows));
  EXPECT_EQ(std::memcmp(decoder.shuffled(), shuffled.data(), 8 * kChunkRows), 0);
}

// Records of 32 bytes filled by pattern, byte column by byte column, to drive each path of the codec's stream: zlib
// pieces (default and run-length), stored blocks written by the codec itself (a column first or last in the chunk,
// longer than a stored block's 65,535 bytes, after a sync flush), pieces cut where they fill, the final empty block.
// `fibonacci`: each byte column's values counted 1, 1, 2, 3, 5, 8, ... times, in random order: a Huffman code for
// them would be deeper than deflate's 15 bits.
enum class Pattern { constant, random, alternating_columns, alternating_rows, runs_around_258, fibonacci };

std::vector<std::byte> patterned_records(Pattern pattern, std::size_t rows, std::size_t record_bytes, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<std::byte> out(rows * record_bytes);
  for (std::size_t b = 0; b < record_bytes; ++b) {
    const auto value = static_cast<std::byte>(37 * b + 11);
    std::vector<std::byte> fibonacci;
    if (pattern == Pattern::fibonacci) {
      for (std::size_t v = 0, count = 1, before = 0; fibonacci.size() < rows; ++v) {
        for (std::size_t k = 0; k < count && fibonacci.size() < rows; ++k) fibonacci.push_back(static_cast<std::byte>(v));
        const std::size_t next = count + before;
        before = count;
        count = next;
      }
      std::shuffle(fibonacci.begin(), fibonacci.end(), gen);
    }
    std::size_t run = 0, run_length = 257;
    std::byte run_value{0};
    for (std::size_t i = 0; i < rows; ++i) {
      std::byte& o = out[i * record_bytes + b];
      switch (pattern) {
        case Pattern::constant: o = value; break;
        case Pattern::random: o = static_cast<std::byte>(gen()); break;
        case Pattern::alternating_columns: o = b % 2 == 0 ? value : static_cast<std::byte>(gen()); break;
        case Pattern::alternating_rows: o = i % 2 == 0 ? value : ~value; break;
        case Pattern::fibonacci: o = fibonacci[i]; break;
        case Pattern::runs_around_258:  // runs of 257, 258, 259, 260 bytes, each a new value
          if (run == run_length) {
            run = 0;
            run_length = run_length == 260 ? 257 : run_length + 1;
            run_value = static_cast<std::byte>(gen());
          }
          o = run_value;
          ++run;
          break;
      }
    }
  }
  return out;
}

// Every stream the codec writes is one that zlib's inflate (what HDF5's deflate filter runs) decodes, exactly to the
// shuffled chunk, with nothing left over, the Adler-32 checked; and the reader's decoder gets the records back. Byte
// columns of 1 to 32,769 rows (around deflate's 258-byte matches, its 32 KiB window, the codec's 64,512-byte pieces
// and 65,535-byte stored blocks), whole and partial chunks, every byte column constant, random, alternating, in runs,
// or with counts that need deflate's 15-bit limit on code lengths; the codec's own run-length blocks spliced to zlib's.
TEST(trace_codec_test, every_stream_it_writes_inflates_to_the_shuffled_chunk) {
  constexpr std::size_t kRecordBytes = 32;
  // No float ranges (all default strategy); everything f64 (a stored column may come first and last); ints then f64;
  // ints, f64, ints (zlib after the codec's own blocks, as in /ops).
  const std::vector<std::vector<ByteRange>> layouts = {{}, {{0, 32}}, {{8, 32}}, {{8, 24}}};
  int streams = 0;
  for (std::size_t chunk_rows : {1, 2, 257, 258, 259, 1024, 2016, 2017, 8191, 32767, 32768, 32769}) {
    for (const Pattern pattern : {Pattern::constant, Pattern::random, Pattern::alternating_columns, Pattern::alternating_rows,
                                  Pattern::runs_around_258, Pattern::fibonacci}) {
      const std::vector<std::byte> records =
          patterned_records(pattern, chunk_rows, kRecordBytes, static_cast<unsigned>(chunk_rows * 7 + static_cast<int>(pattern)));
      for (std::size_t layout = 0; layout < layouts.size(); ++layout) {
        ChunkCodec codec(kRecordBytes, chunk_rows, 1, layouts[layout]);
        ChunkDecoder decoder(kRecordBytes, chunk_rows);
        for (std::size_t rows : {chunk_rows, std::size_t{1}, chunk_rows / 2 + 1}) {
          if (rows > chunk_rows) continue;
          const std::string what = "pattern " + std::to_string(static_cast<int>(pattern)) + ", layout " + std::to_string(layout) +
                                   ", " + std::to_string(rows) + " of " + std::to_string(chunk_rows) + " rows";
          std::vector<std::byte> stored;
          codec.encode(records.data(), rows, stored);
          ASSERT_NO_FATAL_FAILURE(expect_inflates_to_chunk(stored, records, rows, kRecordBytes, chunk_rows, decoder, what));
          // Random bytes grow by at most the blocks' headers (zlib stores a 4,095-symbol block that would grow: 5 bytes);
          // constant ones shrink to almost nothing.
          EXPECT_LE(stored.size(), kRecordBytes * chunk_rows + kRecordBytes * chunk_rows / 400 + 200) << what;
          if (pattern == Pattern::constant && rows == chunk_rows && rows >= 256) {
            EXPECT_LE(stored.size(), 60 + kRecordBytes * chunk_rows / 100) << what;
          }
          ++streams;
        }
      }
    }
  }
  EXPECT_GT(streams, 800);
}

// A partial chunk of fewer than 256 rows within its budget is written by the codec alone (one block of deflate's
// fixed codes, runs that go on across columns and over each column's zeros, the Adler-32 of the zeros added without
// reading them): zlib's inflate and the reader's decoder must give back the shuffled chunk, zeros included, after
// the codec's buffer held other bytes there; one byte less of budget must give zlib's stream instead, unchanged.
TEST(trace_codec_test, partial_chunks_in_fixed_codes_inflate_to_the_shuffled_chunk) {
  const std::vector<std::vector<ByteRange>> layouts = {{}, {{8, 24}}};
  int streams = 0, own = 0;
  for (std::size_t record_bytes : {1, 9, 32, 209}) {
    for (std::size_t chunk_rows : {2, 3, 64, 128, 255}) {
      for (int pattern = 0; pattern < 8; ++pattern) {
        std::vector<std::byte> records;
        if (pattern < 6) {
          records = patterned_records(static_cast<Pattern>(pattern), chunk_rows, record_bytes,
                                      static_cast<unsigned>(chunk_rows * 11 + record_bytes + static_cast<std::size_t>(pattern)));
        } else {
          // Trace-like: most columns zero (runs that go on across many columns, longer than 258), some small values,
          // some random; pattern 7 also with nonzero last bytes (a literal zero before each column's zeros).
          std::mt19937 gen(static_cast<unsigned>(chunk_rows + record_bytes));
          records.assign(chunk_rows * record_bytes, std::byte{0});
          for (std::size_t i = 0; i < chunk_rows; ++i) {
            for (std::size_t b = 0; b < record_bytes; ++b) {
              std::byte& o = records[i * record_bytes + b];
              if (b % 8 == 0) o = static_cast<std::byte>(i % 5);
              if (b % 16 == 3) o = static_cast<std::byte>(gen());
              if (pattern == 7 && b % 3 == 2) o = std::byte{0x80};
            }
          }
        }
        const std::vector<std::byte> garbage(chunk_rows * record_bytes, std::byte{0xA5});
        for (std::size_t layout = 0; layout < layouts.size(); ++layout) {
          if (!layouts[layout].empty() && layouts[layout][0].end > record_bytes) continue;
          ChunkCodec codec(record_bytes, chunk_rows, 1, layouts[layout]);
          ChunkDecoder decoder(record_bytes, chunk_rows);
          for (std::size_t rows : {std::size_t{1}, chunk_rows / 2, chunk_rows - 1}) {
            if (rows == 0) continue;
            const std::string what = std::to_string(record_bytes) + "-byte records, pattern " + std::to_string(pattern) +
                                     ", layout " + std::to_string(layout) + ", " + std::to_string(rows) + " of " +
                                     std::to_string(chunk_rows) + " rows";
            std::vector<std::byte> scratch, by_zlib, stored, fallback;
            codec.encode(garbage.data(), chunk_rows, scratch);  // the codec's buffer full of other bytes
            codec.encode(records.data(), rows, by_zlib);        // no budget: zlib's stream, as before
            codec.encode(garbage.data(), chunk_rows, scratch);
            codec.encode(records.data(), rows, stored, std::size_t{1} << 30);
            // The codec's own stream: one final block of fixed codes (BFINAL 1, BTYPE 01 in the first three bits).
            ASSERT_EQ(std::to_integer<unsigned>(stored[2]) & 7u, 3u) << what;
            own += stored != by_zlib ? 1 : 0;  // zlib too writes one fixed block for a few bytes, sometimes the same
            ASSERT_NO_FATAL_FAILURE(expect_inflates_to_chunk(stored, records, rows, record_bytes, chunk_rows, decoder, what));
            // The budget is the most it takes; a byte less and zlib writes the chunk (its zeros written back first).
            codec.encode(garbage.data(), chunk_rows, scratch);
            codec.encode(records.data(), rows, fallback, stored.size());
            ASSERT_EQ(fallback, stored) << what;
            codec.encode(garbage.data(), chunk_rows, scratch);
            codec.encode(records.data(), rows, fallback, stored.size() - 1);
            ASSERT_EQ(fallback, by_zlib) << what;
            // A full chunk is zlib's whatever the budget.
            codec.encode(records.data(), chunk_rows, scratch, std::size_t{1} << 30);
            codec.encode(records.data(), chunk_rows, fallback);
            ASSERT_EQ(scratch, fallback) << what;
            ++streams;
          }
        }
      }
    }
  }
  EXPECT_GT(streams, 400);
  EXPECT_GT(own, streams / 2);
  // Chunks of 256 rows or more keep zlib's stream (with the codec's stored and run-length blocks) at any budget.
  const std::vector<std::byte> records = patterned_records(Pattern::alternating_rows, 256, 16, 5);
  ChunkCodec codec(16, 256, 1);
  std::vector<std::byte> a, b;
  codec.encode(records.data(), 100, a);
  codec.encode(records.data(), 100, b, std::size_t{1} << 30);
  EXPECT_EQ(a, b);
}

TEST(trace_codec_test, refuses_bytes_that_are_not_a_whole_chunk) {
  constexpr std::size_t kRecordBytes = 45, kChunkRows = 200;
  const std::vector<std::byte> records = random_bytes(kRecordBytes * kChunkRows, 23);
  ChunkCodec codec(kRecordBytes, kChunkRows, 1);
  std::vector<std::byte> stored;
  codec.encode(records.data(), kChunkRows, stored);
  ChunkDecoder decoder(kRecordBytes, kChunkRows);
  ASSERT_TRUE(decoder.inflate(stored.data(), stored.size()));

  std::vector<std::byte> checksum = stored;
  checksum[checksum.size() - 1] ^= std::byte{1};  // the Adler-32 trailer
  EXPECT_FALSE(decoder.inflate(checksum.data(), checksum.size()));
  std::vector<std::byte> header = stored;
  header[0] = std::byte{0x79};  // not deflate
  EXPECT_FALSE(decoder.inflate(header.data(), header.size()));
  EXPECT_FALSE(decoder.inflate(stored.data(), stored.size() / 2));  // truncated
  ChunkDecoder bigger(kRecordBytes, kChunkRows + 1);                 // a stream of another size
  EXPECT_FALSE(bigger.inflate(stored.data(), stored.size()));
  std::vector<std::byte> noise = random_bytes(stored.size(), 29);
  EXPECT_FALSE(decoder.inflate(noise.data(), noise.size()));
  EXPECT_FALSE(decoder.inflate_prefix(noise.data(), noise.size(), 8 * kChunkRows));
}

}  // namespace
}  // namespace ampscope::trace::detail
