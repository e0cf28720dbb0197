// Tests of core/safetensors: round trips, exact bytes of a hand-written file, hand-written bad files
// (each refused with a message that names the problem), and a sharded Hugging Face folder.
#include "core/io/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

#include "tests/test_support.h"

namespace ampscope {
namespace {

namespace fs = std::filesystem;
using safetensors::File;

fs::path scratch(const std::string& name) { return testing::process_scratch_dir("ampscope_safetensors") / name; }

// A file from its parts: the 8-byte little-endian length of `header`, `header`, then `buffer`.
fs::path write_raw(const std::string& name, const std::string& header, const std::string& buffer,
                   std::uint64_t length_override = UINT64_MAX) {
  const fs::path p = scratch(name);
  std::ofstream out(p, std::ios::binary);
  std::uint64_t n = length_override == UINT64_MAX ? header.size() : length_override;
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << buffer;
  return p;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

template <class T>
Tensor from_bits(const std::vector<T>& bits, DType dtype, Shape shape) {
  Tensor t = Tensor::empty(shape, TensorOptions{dtype, Device::cpu()});
  if (!bits.empty()) std::memcpy(t.data(), bits.data(), bits.size() * sizeof(T));
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const std::size_t n = static_cast<std::size_t>(a.numel()) * dtype_size(a.dtype());
  return n == 0 || std::memcmp(a.contiguous().data(), b.contiguous().data(), n) == 0;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(safetensors_test, writes_the_bytes_of_the_format_for_a_small_file) {
  // Hand-worked: 1.0f = 0x3F800000 and -2.0f = 0xC0000000, little-endian; the header JSON (54 bytes)
  // padded with two spaces to 56, a multiple of 8.
  const fs::path p = scratch("small.safetensors");
  safetensors::save(p, {{"a", from_values({1.0, -2.0}, {2})}});
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_EQ(header.size(), 54u);
  std::string expected("\x38\0\0\0\0\0\0\0", 8);
  expected += header + "  ";
  expected += std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0", 8);
  EXPECT_EQ(read_bytes(p), expected);
  EXPECT_FALSE(fs::exists(p.string() + ".tmp"));
}

TEST(safetensors_test, round_trips_every_dtype_bit_for_bit_with_metadata) {
  std::vector<std::uint16_t> all16(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) all16[i] = static_cast<std::uint16_t>(i);  // NaN payloads, inf, -0, subnormals
  const std::vector<std::uint32_t> f32 = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00001, 0xffa00003,
                                          0x00000001, 0x807fffff, 0x3f800000, 0x7f7fffff};
  const std::vector<std::uint64_t> f64 = {0x0000000000000000, 0x8000000000000000, 0x7ff0000000000000,
                                          0x7ff8000000000001, 0x0000000000000001, 0x3ff0000000000000};
  const std::vector<std::int64_t> i64 = {std::numeric_limits<std::int64_t>::min(), -1, 0, 1,
                                         std::numeric_limits<std::int64_t>::max()};
  const std::vector<std::pair<std::string, Tensor>> tensors = {
      {"f16", from_bits(all16, DType::f16, {256, 256})},
      {"bf16", from_bits(all16, DType::bf16, {65536})},
      {"f32", from_bits(f32, DType::f32, {2, 5})},
      {"f64", from_bits(f64, DType::f64, {3, 1, 2})},
      {"i64", from_bits(i64, DType::i64, {5})},
      {"scalar", from_bits(std::vector<std::uint32_t>{0x40490fdb}, DType::f32, {})},
      {"empty", from_bits(std::vector<std::uint16_t>{}, DType::bf16, {0, 3})},
      {"transposed", from_values({1, 2, 3, 4, 5, 6}, {2, 3}).transpose(0, 1)},  // written contiguous
  };
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "ünïcode"}};
  const fs::path p = scratch("all.safetensors");
  safetensors::save(p, tensors, metadata);
  const File f = File::open(p);
  EXPECT_EQ(f.metadata(), metadata);
  ASSERT_EQ(f.tensors().size(), tensors.size());
  EXPECT_EQ(f.tensors().front().name, "bf16");  // name order
  for (const auto& [name, t] : tensors) {
    const Tensor back = f.load(name);
    EXPECT_TRUE(same_bytes(back, t.contiguous())) << name;
  }
  EXPECT_EQ(f.info("f64").dtype_name, "F64");
  EXPECT_EQ(f.load("transposed").values(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(f.load("scalar").dim(), 0);
  // Header padded to a multiple of 8 with spaces, as the reference implementation does.
  const std::string bytes = read_bytes(p);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
}

TEST(safetensors_test, widens_f16_and_bf16_exactly_to_f32) {
  std::vector<std::uint16_t> all16(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) all16[i] = static_cast<std::uint16_t>(i);
  const fs::path p = scratch("widen.safetensors");
  safetensors::save(p, {{"h", from_bits(all16, DType::f16, {65536})}, {"b", from_bits(all16, DType::bf16, {65536})}});
  const File f = File::open(p);
  const Tensor h = f.load("h", DType::f32), b = f.load("b", DType::f32);
  ASSERT_EQ(h.dtype(), DType::f32);
  const float* hv = h.data_as<float>();
  const float* bv = b.data_as<float>();
  int bad = 0;
  for (std::uint32_t i = 0; i < 65536 && bad < 5; ++i) {
    // References: the compiler's _Float16, and bf16 as the upper half of an f32 (its definition).
    _Float16 half;
    const std::uint16_t bits = static_cast<std::uint16_t>(i);
    std::memcpy(&half, &bits, 2);
    const float want_h = static_cast<float>(half);
    const std::uint32_t want_b = i << 16;
    std::uint32_t got_b;
    std::memcpy(&got_b, &bv[i], 4);
    const bool h_ok = std::isnan(want_h) ? std::isnan(hv[i]) : std::memcmp(&want_h, &hv[i], 4) == 0;
    const bool b_ok = std::isnan(bv[i]) ? ((want_b & 0x7fffffff) > 0x7f800000) : got_b == want_b;
    if (!h_ok || !b_ok) {
      ++bad;
      ADD_FAILURE() << "bits 0x" << std::hex << i << ": f16 " << hv[i] << " want " << want_h << ", bf16 0x" << got_b
                    << " want 0x" << want_b;
    }
  }
}

struct BadCase {
  const char* what;
  std::string header;
  std::string buffer;
  const char* message;
};

TEST(safetensors_test, refuses_hand_written_bad_files_naming_the_problem) {
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string eight(8, '\0');
  const std::vector<BadCase> cases = {
      {"not an object", R"([1,2])", "", "header does not start with '{'"},
      {"invalid json", R"({"a":)", "", "not valid UTF-8 JSON"},
      {"invalid utf-8", "{\"\xff\":1}", "", "not valid UTF-8 JSON"},
      {"missing dtype", R"({"a":{"shape":[2],"data_offsets":[0,8]}})", eight, "tensor 'a': entry lacks the \"dtype\""},
      {"missing shape", R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", eight, "lacks the \"shape\""},
      {"missing offsets", R"({"a":{"dtype":"F32","shape":[2]}})", eight, "lacks the \"data_offsets\""},
      {"entry not object", R"({"a":3})", "", "tensor 'a': entry is not an object"},
      {"unknown field", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", eight, "unknown field \"x\""},
      {"dtype not string", R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", eight, "\"dtype\" is not a string"},
      {"unknown dtype", R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", eight,
       "dtype 'Q7' is not supported (supported: F32, F16, BF16, F64, I64)"},
      {"refused dtype", R"({"a":{"dtype":"I8","shape":[8],"data_offsets":[0,8]}})", eight,
       "tensor 'a': dtype 'I8' is not supported"},
      {"negative shape", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight,
       "shape entry -2 is not a non-negative integer"},
      {"fractional shape", R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", eight,
       "shape entry 2.0 is not a non-negative integer"},
      {"size mismatch", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight,
       "shape [3] of F32 needs 12 bytes but data_offsets [0, 8] hold 8"},
      {"overflow", R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", eight,
       "has more bytes than 64 bits can count"},
      {"overflow by element size", R"({"a":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,8]}})",
       eight, "has more bytes than 64 bits can count"},
      {"reversed offsets", R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", eight, "end before they begin"},
      {"offsets not pair", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", eight,
       "\"data_offsets\" is not an array of two"},
      {"range past the end", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", eight,
       "data_offsets [0, 16] run past the end of the 8-byte buffer"},
      {"overlap", "{" + ok_entry + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight,
       "tensor 'b' (bytes [4, 8]) overlaps tensor 'a' (bytes [0, 8])"},
      {"hole", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight,
       "bytes [0, 4] of the buffer belong to no tensor (before tensor 'a')"},
      {"trailing bytes", "{" + ok_entry + "}", eight + "xx", "bytes [8, 10] at the end of the buffer belong to no tensor"},
      {"duplicate names", "{" + ok_entry + "," + ok_entry + "}", eight, "duplicate key: tensor name 'a'"},
      {"duplicate field", R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", eight,
       "duplicate key: field 'dtype' of entry 'a'"},
      {"metadata not strings", R"({"__metadata__":{"k":1}})", "", "\"__metadata__\" entry 'k' is not a string"},
  };
  for (const auto& c : cases) {
    const fs::path p = write_raw("bad.safetensors", c.header, c.buffer);
    const std::string msg = error_of([&] { File::open(p); });
    EXPECT_NE(msg.find(c.message), std::string::npos) << c.what << ": " << msg;
    EXPECT_NE(msg.find(p.string()), std::string::npos) << c.what << " names the file: " << msg;
  }
}

TEST(safetensors_test, refuses_bad_lengths_and_truncations) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string buf(8, '\0');
  auto msg_of = [&](const fs::path& p) { return error_of([&] { File::open(p); }); };
  {
    const fs::path p = scratch("short.safetensors");
    std::ofstream(p, std::ios::binary) << "abc";
    EXPECT_NE(msg_of(p).find("file is 3 bytes, shorter than the 8-byte header length"), std::string::npos) << msg_of(p);
  }
  EXPECT_NE(msg_of(write_raw("l1.safetensors", "{", "", 1)).find("header length 1 is below 2"), std::string::npos);
  EXPECT_NE(msg_of(write_raw("lhuge.safetensors", header, buf, 200'000'000)).find("exceeds the 100000000 byte limit"),
            std::string::npos);
  // Truncated header: the length says more than the file holds.
  EXPECT_NE(msg_of(write_raw("ltrunc.safetensors", header.substr(0, 20), "", header.size()))
                .find("header length 54 runs past the end of the file (20 bytes after the length)"),
            std::string::npos);
  // Truncated buffer.
  EXPECT_NE(msg_of(write_raw("btrunc.safetensors", header, buf.substr(0, 5)))
                .find("data_offsets [0, 8] run past the end of the 5-byte buffer"),
            std::string::npos);
  // Padding with spaces is allowed, and an empty header object is a valid (empty) file.
  EXPECT_EQ(File::open(write_raw("padded.safetensors", header + "    ", buf)).tensors().size(), 1u);
  EXPECT_TRUE(File::open(write_raw("empty.safetensors", "{}", "")).tensors().empty());
  EXPECT_NE(msg_of(scratch("missing.safetensors")).find("cannot open"), std::string::npos);
}

TEST(safetensors_test, writer_refuses_duplicate_names_and_dtypes_it_cannot_store) {
  const fs::path p = scratch("w.safetensors");
  const Tensor t = from_values({1}, {1});
  EXPECT_NE(error_of([&] { safetensors::save(p, {{"a", t}, {"a", t}}); }).find("tensor name 'a' appears twice"),
            std::string::npos);
  EXPECT_NE(error_of([&] { safetensors::save(p, {{"m", t.to(DType::boolean)}}); })
                .find("tensor 'm' is bool, which this writer does not store"),
            std::string::npos);
  EXPECT_NE(error_of([&] { safetensors::save(p, {{"__metadata__", t}}); }).find("reserved"), std::string::npos);
  EXPECT_NE(error_of([&] { safetensors::save(p, {{"u", Tensor()}}); }).find("tensor 'u' is undefined"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(p));
  EXPECT_NE(error_of([&] { File::open(p).load("x"); }).find("cannot open"), std::string::npos);
  safetensors::save(p, {{"a", t}});
  EXPECT_NE(error_of([&] { File::open(p).load("b"); }).find("has no tensor 'b'"), std::string::npos);
}

TEST(safetensors_test, loads_a_sharded_folder_by_name_and_names_missing_shards_and_tensors) {
  const fs::path dir = scratch("sharded");
  fs::create_directories(dir);
  safetensors::save(dir / "model-00001-of-00002.safetensors", {{"wte", from_values({1, 2, 3, 4}, {2, 2}, {DType::f16})}});
  safetensors::save(dir / "model-00002-of-00002.safetensors", {{"ln.bias", from_values({0.5}, {1}, {DType::bf16})}});
  auto write_index = [&](const std::string& weight_map) {
    std::ofstream(dir / "model.safetensors.index.json") << R"({"metadata":{"total_size":10},"weight_map":)" << weight_map
                                                        << "}";
  };
  write_index(R"({"wte":"model-00001-of-00002.safetensors","ln.bias":"model-00002-of-00002.safetensors"})");
  const auto all = safetensors::load_folder(dir, DType::f32);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all.at("wte").values(), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(all.at("wte").dtype(), DType::f32);
  EXPECT_EQ(all.at("ln.bias").values(), std::vector<double>{0.5});

  write_index(R"({"wte":"model-00003-of-00002.safetensors"})");
  std::string msg = error_of([&] { safetensors::load_folder(dir); });
  EXPECT_NE(msg.find("tensor 'wte' is in shard 'model-00003-of-00002.safetensors', which is missing"),
            std::string::npos) << msg;
  write_index(R"({"wpe":"model-00001-of-00002.safetensors"})");
  msg = error_of([&] { safetensors::load_folder(dir); });
  EXPECT_NE(msg.find("tensor 'wpe' is not in shard 'model-00001-of-00002.safetensors'"), std::string::npos) << msg;
  write_index(R"({"wpe":"../x.safetensors"})");
  msg = error_of([&] { safetensors::load_folder(dir); });
  EXPECT_NE(msg.find("not a file name in the folder"), std::string::npos) << msg;

  const fs::path single = scratch("single");
  fs::create_directories(single);
  safetensors::save(single / "model.safetensors", {{"w", from_values({7}, {1})}});
  EXPECT_EQ(safetensors::load_folder(single).at("w").item(), 7.0);
  msg = error_of([&] { safetensors::load_folder(scratch("none")); });
  EXPECT_NE(msg.find("has neither model.safetensors nor model.safetensors.index.json"), std::string::npos) << msg;
}

}  // namespace
}  // namespace ampscope
