// Token files made to hurt the reader, and token files too large to hold (issue 36): FIFOs and /dev/zero as
// a .npy, .bin or .txt file (refused by name without blocking); a sparse 2 GiB .bin and a 512 MiB .npy opened,
// checked and batched in memory that does not grow with the file (it cost 3.3 GB of memory per GiB of .bin
// when the whole file became a vector of int32), with the ids at known places read back where a hand count
// puts them; a file truncated while in use (a clean error, not a crash); in-memory sequences that widen from
// 2 to 4 bytes an id.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "models/token_data.h"
#include "tests/support/hostile_files.h"
#include "tests/test_support.h"
#include "tests/tokens/token_test_util.h"

namespace ampscope::samples {
namespace {

namespace fs = std::filesystem;

fs::path scratch() { return testing::process_scratch_dir("ampscope_token_hostile"); }

// The process's peak resident memory growth around `f` (VmHWM reset first), in bytes; nullopt where the
// kernel does not let a process reset it.
std::optional<long> peak_growth(const std::function<void()>& f) {
  const auto read_kb = [](const char* key) -> long {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind(key, 0) == 0) return std::stol(line.substr(std::string(key).size()));
    return -1;
  };
  {
    std::ofstream reset("/proc/self/clear_refs");
    reset << "5";  // resets the peak resident set size (Documentation/filesystems/proc.rst)
    if (!reset) return std::nullopt;
  }
  const long before = read_kb("VmRSS:");
  if (read_kb("VmHWM:") > before + 1024) return std::nullopt;
  f();
  return (read_kb("VmHWM:") - before) * 1024;
}

// Writes `bytes` at `offset` of an existing file (the rest of a sparse file stays a hole).
void write_at(const fs::path& p, std::uint64_t offset, const testing::Bytes& bytes) {
  const int fd = ::open(p.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset)), static_cast<ssize_t>(bytes.size()));
  ::close(fd);
}

TEST(token_hostile_test, a_fifo_or_a_device_as_a_token_file_is_refused_by_name_without_blocking) {
  for (const char* name : {"fifo.npy", "fifo.bin", "fifo.txt"}) {
    const fs::path fifo = testing::make_fifo(scratch() / name);
    const std::string m = testing::refusal_within<TokenFileError>([&] { (void)TokenSequence::open(fifo); }, {fifo});
    EXPECT_EQ(m, fmt::format("token file '{}': not a regular file: it is a FIFO (named pipe)\nhint: --tokens takes a "
                             ".npy, .bin or .txt file of token ids",
                             fifo.string()));
  }
  for (const char* name : {"zero.npy", "zero.bin", "zero.txt"}) {
    const fs::path zero = testing::make_link(scratch() / name, "/dev/zero");
    const std::string m = testing::refusal_within<TokenFileError>([&] { (void)load_tokens(zero); });
    EXPECT_NE(m.find(fmt::format("token file '{}': not a regular file: it is a character device", zero.string())),
              std::string::npos)
        << m;
  }
}

TEST(token_hostile_test, a_sparse_2_gib_bin_is_opened_checked_and_batched_in_bounded_memory) {
  const fs::path p = scratch() / "sparse.bin";
  fs::remove(p);
  std::ofstream(p).close();
  constexpr std::uint64_t kBytes = std::uint64_t{2} << 30;  // 1 G uint16 ids, all 0 but those written below
  fs::resize_file(p, kBytes);
  // Ids at the first window, and at the last whole window of context 4: windows = (n - 1) / 4.
  const std::int64_t n = static_cast<std::int64_t>(kBytes / 2);
  const std::int64_t windows = (n - 1) / 4;
  ASSERT_EQ(windows, 268435455);
  write_at(p, 0, testing::le_values({11, 12, 13, 14, 15}, 2));
  const std::uint64_t last = static_cast<std::uint64_t>(windows - 1) * 4;
  write_at(p, last * 2, testing::le_values({50000, 50001, 50002, 50003, 50004}, 2));

  std::optional<TokenSequence> seq;
  TokenBatch first, end;
  const auto growth = peak_growth([&] {
    seq.emplace(TokenSequence::open(p));
    check_vocabulary(*seq, 50257, p);  // every id is below GPT-2's 50257: no second pass
    first = causal_lm_batch(*seq, 4, 1, 0);
    end = causal_lm_batch(*seq, 4, 1, windows - 1);  // step s uses window s mod windows (batch 1)
  });
  ASSERT_TRUE(seq.has_value());
  EXPECT_TRUE(seq->on_disk());
  EXPECT_EQ(seq->size(), n);
  EXPECT_EQ(seq->max_id(), 50004);
  EXPECT_EQ(first.x.values(), (std::vector<double>{11, 12, 13, 14}));
  EXPECT_EQ(first.y.values(), (std::vector<double>{12, 13, 14, 15}));
  EXPECT_EQ(end.x.values(), (std::vector<double>{50000, 50001, 50002, 50003}));
  EXPECT_EQ(end.y.values(), (std::vector<double>{50001, 50002, 50003, 50004}));
  if (!growth) GTEST_SKIP() << "this kernel does not let a process reset its peak RSS (/proc/self/clear_refs)";
  std::printf("2 GiB .bin: open, vocabulary check and 2 batches grew the peak RSS by %.1f MiB\n", *growth / 1048576.0);
  EXPECT_LT(*growth, 32L << 20) << "memory grew with the file";
}

TEST(token_hostile_test, a_sparse_npy_is_checked_in_bounded_memory_and_its_bad_id_named) {
  const fs::path p = scratch() / "sparse.npy";
  const std::uint64_t count = std::uint64_t{1} << 26;  // int64: 512 MiB of data
  const testing::Bytes header =
      testing::make_npy(1, fmt::format("{{'descr': '<i8', 'fortran_order': False, 'shape': ({},), }}", count), {});
  testing::write_bytes(p, header);
  fs::resize_file(p, header.size() + count * 8);
  write_at(p, header.size() + 8 * 7, testing::le_values({70000}, 8));  // needs the 4-byte in-memory form too
  std::optional<TokenSequence> seq;
  const auto growth = peak_growth([&] { seq.emplace(TokenSequence::open(p)); });
  EXPECT_EQ(seq->size(), static_cast<std::int64_t>(count));
  EXPECT_EQ(seq->max_id(), 70000);
  std::vector<std::int64_t> ids(9);
  seq->read(0, 9, ids.data());
  EXPECT_EQ(ids, (std::vector<std::int64_t>{0, 0, 0, 0, 0, 0, 0, 70000, 0}));
  if (growth) {
    std::printf("512 MiB .npy: open grew the peak RSS by %.1f MiB\n", *growth / 1048576.0);
    EXPECT_LT(*growth, 32L << 20);
  }
  // A negative id far into the file: named with its element and byte offset, as always.
  const std::uint64_t at = count - 3;
  write_at(p, header.size() + at * 8, testing::le_values({-100}, 8));
  EXPECT_THROW_MSG(TokenSequence::open(p), TokenFileError,
                   fmt::format("element {} (byte offset {}, dtype '<i8') holds -100: token ids are never negative", at,
                               header.size() + at * 8));
}

TEST(token_hostile_test, an_on_disk_id_outside_the_vocabulary_is_found_by_a_second_pass_and_named) {
  const fs::path p = scratch() / "outside.bin";
  testing::write_bytes(p, testing::le_values({3, 9, 4, 12, 9, 12, 0}, 2));
  const TokenSequence seq = TokenSequence::open(p);
  EXPECT_EQ(seq.max_id(), 12);
  check_vocabulary(seq, 13, p);
  // Ids 12, 9, 12 are at or past 9: the first is element 1 (id 9).
  EXPECT_THROW_MSG(check_vocabulary(seq, 9, p), TokenFileError,
                   "element 1 holds id 9, outside the model's vocabulary of 9 ids (0 to 8); 4 of the 7 ids are outside "
                   "it, the largest is 12");
}

TEST(token_hostile_test, a_file_truncated_while_in_use_is_a_clean_error_naming_it) {
  const fs::path p = scratch() / "shrinks.bin";
  testing::write_bytes(p, testing::le_values({1, 2, 3, 4, 5, 6, 7, 8, 9}, 2));
  const TokenSequence seq = TokenSequence::open(p);
  fs::resize_file(p, 6);  // 3 ids left of 9
  EXPECT_THROW_MSG(causal_lm_batch(seq, 4, 2, 0), TokenFileError, fmt::format("token file '{}': cannot read it", p.string()),
                   "changed while it was read", "hint:");
}

TEST(token_hostile_test, in_memory_sequences_keep_2_bytes_an_id_until_one_needs_4) {
  TokenSequence seq;
  const std::vector<std::int32_t> small = {0, 65535, 7};
  seq.append(small.data(), small.size());
  EXPECT_EQ(seq.to_vector(), small);
  const std::vector<std::int32_t> big = {65536, 2147483647};
  seq.append(big.data(), big.size());
  EXPECT_EQ(seq.to_vector(), (std::vector<std::int32_t>{0, 65535, 7, 65536, 2147483647}));
  EXPECT_EQ(seq.max_id(), 2147483647);
  EXPECT_FALSE(seq.on_disk());
  const std::int32_t negative = -1;
  EXPECT_THROW_MSG(seq.append(&negative, 1), Error, "id -1 is negative");
  std::vector<std::int64_t> out(2);
  EXPECT_THROW_MSG(seq.read(4, 2, out.data()), Error, "ids [4, 6) are outside the 5 ids");
  // The vector and the sequence batch the same windows.
  const std::vector<std::int32_t> ids = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const TokenSequence from = TokenSequence::from_ids(ids);
  for (std::int64_t step = 0; step < 4; ++step) {
    EXPECT_EQ(causal_lm_batch(from, 3, 2, step).x.values(), causal_lm_batch(ids, 3, 2, step).x.values());
    EXPECT_EQ(seq2seq_batch(from, 4, 2, step, 0).decoder_input.values(), seq2seq_batch(ids, 4, 2, step, 0).decoder_input.values());
  }
}

}  // namespace
}  // namespace ampscope::samples
