// tests/tokens/token_test_util.h: writing token files byte by byte for the token tests.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace ampscope::testing {

using Bytes = std::vector<unsigned char>;

inline void write_bytes(const std::filesystem::path& p, const Bytes& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

inline void write_text(const std::filesystem::path& p, const std::string& s) {
  write_bytes(p, Bytes(s.begin(), s.end()));
}

// Little-endian bytes of `v`, `size` of them, written out by shifts (not by the reader's memcpy).
inline void append_le(Bytes& b, std::uint64_t v, int size) {
  for (int i = 0; i < size; ++i) b.push_back(static_cast<unsigned char>(v >> (8 * i)));
}

// A .npy file from the format's description (numpy's format.py docstring and NEP 1): the magic \x93NUMPY,
// the version bytes, the header length (2 bytes little-endian for 1.0, 4 for 2.0 and 3.0), the header
// text, then `data`. With pad, the header is padded with spaces and ends with '\n' so that the data starts
// at a multiple of 64, as numpy writes it; without, it is used exactly as given.
inline Bytes make_npy(int major, std::string header, const Bytes& data, bool pad = true) {
  const std::size_t prefix = major == 1 ? 10 : 12;
  if (pad) {
    const std::size_t total = prefix + header.size() + 1;
    header += std::string((64 - total % 64) % 64, ' ') + "\n";
  }
  Bytes b = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<unsigned char>(major), 0};
  append_le(b, header.size(), major == 1 ? 2 : 4);
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

// The data of `values`, each `size` bytes little-endian (two's complement for negative ones).
inline Bytes le_values(const std::vector<std::int64_t>& values, int size) {
  Bytes b;
  for (std::int64_t v : values) append_le(b, static_cast<std::uint64_t>(v), size);
  return b;
}

}  // namespace ampscope::testing
