// tests/support/fuzz.h: what the seeded fuzz tests of the readers share (safetensors, token files, tokenizer
// files, model folders): the environment settings, the byte edits most of them make, and the loop that tries
// each mutant and counts what loaded and what was refused.
//
// AMPSCOPE_FUZZ_CASES sets the number of mutants (each test has its own default), AMPSCOPE_FUZZ_SEED the first
// seed (default 1): mutant k is made from an mt19937_64 seeded with seed + k, so a failure names the seed that
// reproduces it.
//
//   const testing::FuzzTally t = testing::run_mutants<TokenFileError>(
//       "TokenFileError", 400, [&](std::mt19937_64& rng, std::uint64_t seed, std::string& label) {
//         Bytes b = original;
//         std::string how;
//         testing::flip_byte(b, rng, how);
//         label = "seed " + std::to_string(seed) + " (" + how + ")";
//         (void)load_tokens(write(b));  // returns: loaded; throws TokenFileError: refused
//       });
#pragma once

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <random>
#include <string>

#include <gtest/gtest.h>

namespace ampscope::testing {

// The environment variable `name` as an unsigned integer, or `fallback` where it is unset or empty.
inline std::uint64_t env_or(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

inline std::uint64_t fuzz_cases(std::uint64_t fallback) { return env_or("AMPSCOPE_FUZZ_CASES", fallback); }
inline std::uint64_t fuzz_seed() { return env_or("AMPSCOPE_FUZZ_SEED", 1); }

// A uniform draw from [lo, hi].
inline std::uint64_t pick(std::mt19937_64& rng, std::uint64_t lo, std::uint64_t hi) {
  return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng);
}

// The byte edits, on any byte container (std::string, std::vector<unsigned char>) of at least one byte; `how`
// says what was done, for the failure message.
template <class Buffer>
void flip_byte(Buffer& b, std::mt19937_64& rng, std::string& how) {  // one byte's bits, anywhere
  const std::size_t at = pick(rng, 0, b.size() - 1);
  b[at] = static_cast<typename Buffer::value_type>(b[at] ^ static_cast<unsigned char>(pick(rng, 1, 255)));
  how = "flip at " + std::to_string(at);
}

template <class Buffer>
void truncate(Buffer& b, std::mt19937_64& rng, std::string& how) {  // to a shorter length, 0 included
  b.resize(pick(rng, 0, b.size() - 1));
  how = "truncate to " + std::to_string(b.size());
}

template <class Buffer>
void insert_or_delete_byte(Buffer& b, std::mt19937_64& rng, std::string& how) {  // anywhere
  const std::size_t at = pick(rng, 0, b.size() - 1);
  if (pick(rng, 0, 1) == 0) {
    b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), static_cast<typename Buffer::value_type>(pick(rng, 0, 255)));
  } else {
    b.erase(b.begin() + static_cast<std::ptrdiff_t>(at));
  }
  how = "insert/delete at " + std::to_string(at);
}

struct FuzzTally {
  std::uint64_t cases = 0, loaded = 0, refused = 0;
};

// Tries fuzz_cases(default_cases) mutants, seeds fuzz_seed() + seed_offset onwards. trial(rng, seed, label) makes
// mutant `seed` from `rng`, names it in `label` (for the failure messages) and tries it: returning counts as
// loaded, throwing Refusal as refused (on_refusal(e) may check the refusal), anything else fails the test
// ("LABEL threw something other than REFUSAL_NAME: ..."). Stops at the first fatal failure, as an ASSERT in a
// plain loop would.
template <class Refusal, class Trial, class OnRefusal>
FuzzTally run_mutants(const std::string& refusal_name, std::uint64_t default_cases, Trial&& trial,
                      OnRefusal&& on_refusal, std::uint64_t seed_offset = 0) {
  FuzzTally tally;
  tally.cases = fuzz_cases(default_cases);
  const std::uint64_t first = fuzz_seed() + seed_offset;
  for (std::uint64_t k = 0; k < tally.cases; ++k) {
    std::mt19937_64 rng(first + k);
    std::string label = "seed " + std::to_string(first + k);
    try {
      trial(rng, first + k, label);
      ++tally.loaded;
    } catch (const Refusal& e) {
      ++tally.refused;
      on_refusal(e);
    } catch (const std::exception& e) {
      ADD_FAILURE() << label << " threw something other than " << refusal_name << ": " << e.what();
      break;
    }
    if (::testing::Test::HasFatalFailure()) break;
  }
  return tally;
}

template <class Refusal, class Trial>
FuzzTally run_mutants(const std::string& refusal_name, std::uint64_t default_cases, Trial&& trial) {
  return run_mutants<Refusal>(refusal_name, default_cases, std::forward<Trial>(trial), [](const Refusal&) {});
}

}  // namespace ampscope::testing
