// The writer's own chunk compression must produce exactly what HDF5's shuffle + deflate filters decode:
// checked against zlib itself (uncompress, which verifies the Adler-32 trailer, and zlib's adler32) and
// a byte-by-byte transpose written here.
#include <zlib.h>

#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "probes/trace_codec.h"

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
  for (std::size_t n : {0, 1, 15, 16, 17, 5535, 5536, 5537, 5552, 100000, 200000}) {
    const auto expected = static_cast<std::uint32_t>(adler32(1, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(n)));
    EXPECT_EQ(adler32_of(1, data.data(), n), expected) << n << " bytes";
  }
  std::vector<std::byte> ones(100000, std::byte{0xFF});  // the largest sums
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

}  // namespace
}  // namespace ampscope::trace::detail
