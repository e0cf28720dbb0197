// Fuzzing the safetensors reader with seeded mutants of a valid file: byte flips, truncations, edits of
// the header's digits and strings, inserted and deleted bytes, changed length fields. Every mutant either
// throws ampscope::Error or opens; one that opens loads every tensor, each tensor's bytes are the mutant's
// bytes at its stated range, and a mutant whose header is untouched lists the original tensors. Never a
// crash, also with runs of up to 10^6 '[' or '{' put in the header. AMPSCOPE_FUZZ_CASES sets the number of
// mutants (default 400, about half a second); AMPSCOPE_FUZZ_SEED the first seed.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>

#include "core/io/safetensors.h"
#include "tests/support/fuzz.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<unsigned char>;

Bytes read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const Bytes& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::uint64_t header_length(const Bytes& b) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[static_cast<std::size_t>(i)];
  return n;
}

Bytes mutate(const Bytes& original, std::mt19937_64& rng, std::string& how) {
  Bytes b = original;
  const std::uint64_t n = header_length(original);
  auto pick = [&](std::uint64_t lo, std::uint64_t hi) { return testing::pick(rng, lo, hi); };
  switch (pick(0, 7)) {
    case 0: testing::flip_byte(b, rng, how); break;  // flip bits anywhere
    case 1: testing::truncate(b, rng, how); break;   // truncate
    case 2: {  // change a digit of the header (shapes, offsets)
      std::vector<std::size_t> digits;
      for (std::size_t i = 8; i < 8 + n; ++i)
        if (b[i] >= '0' && b[i] <= '9') digits.push_back(i);
      const std::size_t at = digits[pick(0, digits.size() - 1)];
      b[at] = static_cast<unsigned char>('0' + pick(0, 9));
      how = "digit at " + std::to_string(at);
      break;
    }
    case 3: {  // change a letter of the header (dtypes, field names, tensor names)
      std::vector<std::size_t> letters;
      for (std::size_t i = 8; i < 8 + n; ++i)
        if (std::isalpha(b[i])) letters.push_back(i);
      const std::size_t at = letters[pick(0, letters.size() - 1)];
      const char* alphabet = "FBIU0123468\"{}[],:_ ";
      b[at] = static_cast<unsigned char>(alphabet[pick(0, std::strlen(alphabet) - 1)]);
      how = "letter at " + std::to_string(at);
      break;
    }
    case 4: {  // insert or delete a byte in the header, keeping or fixing the length
      const std::size_t at = pick(8, 8 + n - 1);
      if (pick(0, 1) == 0) b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), static_cast<unsigned char>(pick(0, 255)));
      else b.erase(b.begin() + static_cast<std::ptrdiff_t>(at));
      if (pick(0, 1) == 0) {
        const std::uint64_t m = b.size() > original.size() ? n + 1 : n - 1;
        for (int i = 0; i < 8; ++i) b[static_cast<std::size_t>(i)] = static_cast<unsigned char>(m >> (8 * i));
      }
      how = "insert/delete at " + std::to_string(at);
      break;
    }
    case 5: {  // a different length field: small deltas, huge values, zero
      const std::uint64_t choices[] = {n + 1, n - 1, n + 8, n - 8, 0, 1, 2, UINT64_MAX, 100'000'001, pick(0, 1u << 20)};
      const std::uint64_t m = choices[pick(0, 9)];
      for (int i = 0; i < 8; ++i) b[static_cast<std::size_t>(i)] = static_cast<unsigned char>(m >> (8 * i));
      how = "length " + std::to_string(m);
      break;
    }
    case 6: {  // several flips in the buffer only
      for (int k = 0; k < 4; ++k) b[pick(8 + n, b.size() - 1)] ^= static_cast<unsigned char>(pick(1, 255));
      how = "buffer flips";
      break;
    }
    default: {  // a run of 100 to 10^6 '[' or '{' inserted in the header, its length fixed (issue 36)
      const std::size_t at = pick(9, 8 + n - 1);
      const std::size_t count = pick(0, 1) == 0 ? pick(100, 1000) : pick(100'000, 1'000'000);
      b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), count, static_cast<unsigned char>(pick(0, 1) ? '[' : '{'));
      const std::uint64_t m = n + count;
      for (int i = 0; i < 8; ++i) b[static_cast<std::size_t>(i)] = static_cast<unsigned char>(m >> (8 * i));
      how = "nesting run of " + std::to_string(count) + " at " + std::to_string(at);
      break;
    }
  }
  return b;
}

TEST(safetensors_fuzz_test, every_mutant_loads_consistently_or_throws_an_error) {
  const fs::path dir = testing::process_scratch_dir("ampscope_safetensors_fuzz");
  const fs::path base = dir / "base.safetensors";
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"wte.weight", from_values({1, 2, 3, 4, 5, 6}, {2, 3}, {DType::f16})},
      {"ln.bias", from_values({0.5, -0.25}, {2}, {DType::bf16})},
      {"h.0.w", from_values({1e-3, 2e5, -7}, {3, 1}, {DType::f32})},
      {"pos", from_values({3}, {}, {DType::i64})},
      {"f64", from_values({0.1, 0.2}, {1, 2}, {DType::f64})},
      {"none", Tensor::empty({0, 4}, {DType::f32})},
  };
  safetensors::save(base, tensors, {{"format", "pt"}});
  const Bytes original = read_bytes(base);
  const auto original_file = safetensors::File::open(base);

  const fs::path p = dir / "mutant.safetensors";
  const testing::FuzzTally tally = testing::run_mutants<Error>(
      "ampscope::Error", 400, [&](std::mt19937_64& rng, std::uint64_t seed, std::string& what) {
        std::string how;
        const Bytes b = mutate(original, rng, how);
        write_bytes(p, b);
        what = "seed " + std::to_string(seed) + " (" + how + ")";
        const auto f = safetensors::File::open(p);
        const std::uint64_t start = 8 + header_length(b);
        for (const auto& info : f.tensors()) {
          const Tensor t = f.load(info.name);
          const std::size_t bytes = static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype());
          ASSERT_EQ(bytes, info.end - info.begin) << what << " " << info.name;
          ASSERT_LE(start + info.end, b.size()) << what;
          ASSERT_TRUE(bytes == 0 || std::memcmp(t.data(), b.data() + start + info.begin, bytes) == 0)
              << what << " " << info.name;
        }
        if (b.size() == original.size() && std::equal(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(start),
                                                      original.begin())) {
          ASSERT_EQ(f.tensors().size(), original_file.tensors().size()) << what;
          for (std::size_t i = 0; i < f.tensors().size(); ++i) {
            EXPECT_EQ(f.tensors()[i].name, original_file.tensors()[i].name);
            EXPECT_EQ(f.tensors()[i].shape, original_file.tensors()[i].shape);
          }
        }
      });
  const std::uint64_t cases = tally.cases, opened = tally.loaded, refused = tally.refused;
  EXPECT_EQ(opened + refused, cases);
  EXPECT_GT(refused, 0u);  // the mutations do reach the checks
  EXPECT_GT(opened, 0u);   // and some (buffer flips, padding) stay valid
  std::printf("safetensors fuzz: %llu mutants, %llu opened, %llu refused\n", static_cast<unsigned long long>(cases),
              static_cast<unsigned long long>(opened), static_cast<unsigned long long>(refused));
}

}  // namespace
}  // namespace ampscope
