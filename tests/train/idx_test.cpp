// tests/train/idx_test.cpp: finding and reading MNIST IDX files (samples/idx.h) under both naming conventions,
// gzipped or not, and the errors for damaged, truncated and foreign files. The files are written here: IDX
// headers byte by byte from the format (magic 00 00, type 08, number of dimensions, big-endian sizes), gzip
// by zlib's own deflate (independent of the reader, which inflates); damage is planted at known places
// (a stored-block gzip whose data byte or CRC is changed, a block header set to the reserved type 3).
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "core/error.h"
#include "samples/idx.h"
#include "tests/support/hostile_files.h"
#include "tests/test_support.h"

namespace ampscope::samples {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;

fs::path fresh_folder(const std::string& name) {
  const fs::path dir = testing::process_scratch_dir("ampscope_idx_test") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write_file(const fs::path& p, const Bytes& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

Bytes idx(std::vector<std::uint32_t> dims, const Bytes& data) {
  Bytes b = {0, 0, 0x08, static_cast<std::uint8_t>(dims.size())};
  for (std::uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<std::uint8_t>(d >> s));
  }
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

// gzip (RFC 1952) by zlib's deflate; level 0 writes stored blocks, whose bytes are the data itself.
Bytes gzip(const Bytes& data, int level = Z_DEFAULT_COMPRESSION) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  Bytes out(deflateBound(&z, static_cast<uLong>(data.size())) + 64);
  z.next_in = const_cast<Bytef*>(data.data());
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// Three 28x28 images (pixel i of the set is i * 7 mod 256) and their labels.
const Bytes kPixels = [] {
  Bytes p(3 * 28 * 28);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::uint8_t>(i * 7 % 256);
  return p;
}();
const Bytes kLabels = {7, 0, 9};
Bytes images_file() { return idx({3, 28, 28}, kPixels); }
Bytes labels_file() { return idx({3}, kLabels); }

void expect_the_three_images(const Dataset& d) {
  ASSERT_EQ(d.x.shape(), (Shape{3, 1, 28, 28}));
  const std::vector<double> x = d.x.values();
  for (std::size_t i = 0; i < x.size(); ++i) {
    // f32 storage of k / 255, as the reader computes it in double and stores it.
    ASSERT_EQ(x[i], static_cast<double>(static_cast<float>(kPixels[i] / 255.0))) << "pixel " << i;
  }
  EXPECT_EQ(d.y.values(), (std::vector<double>{7, 0, 9}));
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no Error thrown";
  return "";
}

TEST(idx_test, finds_mnist_files_under_both_names_plain_or_gzipped) {
  struct Layout {
    std::string images, labels;
    bool gzipped;
  };
  const std::vector<Layout> layouts = {
      {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", false},        // LeCun's names
      {"train-images.idx3-ubyte", "train-labels.idx1-ubyte", false},        // Kaggle's
      {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", true},   // the original downloads
      {"train-images.idx3-ubyte.gz", "train-labels.idx1-ubyte.gz", true},
      {"train-images.idx3-ubyte", "train-labels-idx1-ubyte.gz", false},     // mixed: each found on its own
  };
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.images + " + " + l.labels);
    const fs::path dir = fresh_folder("layout");
    write_file(dir / l.images, l.gzipped ? gzip(images_file()) : images_file());
    write_file(dir / l.labels, l.labels.ends_with(".gz") ? gzip(labels_file()) : labels_file());
    EXPECT_EQ(find_idx_file(dir.string(), "train", "images"), (dir / l.images).string());
    expect_the_three_images(load_mnist(dir.string(), "train"));
  }
  // The test split, and a gzip file whatever its name says: content decides.
  const fs::path dir = fresh_folder("t10k");
  write_file(dir / "t10k-images.idx3-ubyte", gzip(images_file()));
  write_file(dir / "t10k-labels.idx1-ubyte", labels_file());
  expect_the_three_images(load_mnist(dir.string(), "t10k"));
  // Kaggle's archive unpacks some files as a folder holding the file of the same name.
  const fs::path nested = fresh_folder("nested");
  fs::create_directories(nested / "train-images-idx3-ubyte");
  write_file(nested / "train-images-idx3-ubyte" / "train-images-idx3-ubyte", images_file());
  write_file(nested / "train-labels-idx1-ubyte", labels_file());
  expect_the_three_images(load_mnist(nested.string(), "train"));
  // Concatenated gzip members are one file (RFC 1952 2.2).
  const fs::path members = fresh_folder("members");
  const Bytes whole = images_file();
  Bytes two = gzip(Bytes(whole.begin(), whole.begin() + 1000));
  const Bytes rest = gzip(Bytes(whole.begin() + 1000, whole.end()));
  two.insert(two.end(), rest.begin(), rest.end());
  write_file(members / "train-images-idx3-ubyte.gz", two);
  write_file(members / "train-labels-idx1-ubyte", labels_file());
  expect_the_three_images(load_mnist(members.string(), "train"));
}

TEST(idx_test, names_every_file_it_looked_for_and_refuses_a_file_for_the_folder) {
  const fs::path dir = fresh_folder("empty");
  EXPECT_THROW_MSG(load_mnist(dir.string(), "train"), Error, "no MNIST train images file in '" + dir.string() + "'",
                   "looked for train-images-idx3-ubyte, train-images.idx3-ubyte, train-images-idx3-ubyte.gz, "
                   "train-images.idx3-ubyte.gz");
  write_file(dir / "train-images-idx3-ubyte", images_file());
  EXPECT_THROW_MSG(load_mnist(dir.string(), "train"), Error, "no MNIST train labels file",
                   "train-labels-idx1-ubyte, train-labels.idx1-ubyte, train-labels-idx1-ubyte.gz");
  const std::string file = (dir / "train-images-idx3-ubyte").string();
  EXPECT_THROW_MSG(load_mnist(file, "train"), Error, "'" + file + "' is a file",
                   "hint: give its folder, '" + dir.string() + "'");
}

// Issue 36: --data is a folder from elsewhere. A FIFO or a link to /dev/zero under an MNIST name is named as
// what it is (not "no file"), and read_idx itself refuses both without blocking or reading without end.
TEST(idx_test, a_fifo_or_a_device_under_an_mnist_name_is_refused_by_name_without_blocking) {
  const fs::path dir = fresh_folder("special");
  const fs::path fifo = testing::make_fifo(dir / "train-images-idx3-ubyte");
  std::string m = testing::refusal_within<Error>([&] { (void)load_mnist(dir.string(), "train"); }, {fifo});
  EXPECT_NE(m.find("MNIST train images file '" + fifo.string() + "' is not a regular file (a FIFO (named pipe))"),
            std::string::npos)
      << m;
  m = testing::refusal_within<Error>([&] { (void)read_idx(fifo.string()); }, {fifo});
  EXPECT_NE(m.find("cannot read IDX file '" + fifo.string() + "': not a regular file: it is a FIFO (named pipe)"),
            std::string::npos)
      << m;
  fs::remove(fifo);
  write_file(dir / "train-images-idx3-ubyte", images_file());
  const fs::path zero = testing::make_link(dir / "train-labels-idx1-ubyte", "/dev/zero");
  m = testing::refusal_within<Error>([&] { (void)load_mnist(dir.string(), "train"); });
  EXPECT_NE(m.find("MNIST train labels file '" + zero.string() + "' is not a regular file (a character device)"),
            std::string::npos)
      << m;
  m = testing::refusal_within<Error>([&] { (void)read_idx("/dev/zero"); });
  EXPECT_NE(m.find("cannot read IDX file '/dev/zero': not a regular file: it is a character device"), std::string::npos)
      << m;
}

TEST(idx_test, a_damaged_or_cut_gzip_file_is_named_with_what_is_wrong) {
  const fs::path dir = fresh_folder("damaged");
  const fs::path p = dir / "train-images-idx3-ubyte.gz";
  const Bytes stored = gzip(images_file(), /*level=*/0);
  // 10-byte gzip header, a stored block (1 header byte, 4 length bytes), the data, then CRC-32 and length.
  ASSERT_EQ(stored.size(), 10u + 5u + images_file().size() + 8u);

  Bytes data_changed = stored;
  data_changed[15 + 100] ^= 0x01;  // the CRC no longer matches
  write_file(p, data_changed);
  EXPECT_THROW_MSG(read_idx(p.string()), Error, "'" + p.string() + "' is a gzip file whose data is damaged",
                   "zlib: incorrect data check", "hint: download the file again");

  Bytes crc_changed = stored;
  crc_changed[crc_changed.size() - 8] ^= 0xff;
  write_file(p, crc_changed);
  EXPECT_THROW_MSG(read_idx(p.string()), Error, "whose data is damaged", "incorrect data check");

  Bytes bad_block = stored;
  bad_block[10] = 0x07;  // BFINAL 1, BTYPE 11: the reserved block type
  write_file(p, bad_block);
  EXPECT_THROW_MSG(read_idx(p.string()), Error, "whose data is damaged", "invalid block type");

  const Bytes packed = gzip(images_file());
  for (const std::size_t cut : {std::size_t{4}, packed.size() / 2}) {
    write_file(p, Bytes(packed.begin(), packed.end() - static_cast<std::ptrdiff_t>(cut)));
    EXPECT_THROW_MSG(read_idx(p.string()), Error, "is a gzip file that ends early", "an interrupted download?",
                     "hint: download the file again");
  }
  Bytes trailing = packed;
  trailing.insert(trailing.end(), {'j', 'u', 'n', 'k'});
  write_file(p, trailing);
  EXPECT_THROW_MSG(read_idx(p.string()), Error, "holds 4 bytes after the end of its gzip data");
}

TEST(idx_test, a_file_that_is_not_idx_is_described_by_its_first_bytes_and_never_called_gzip) {
  const fs::path dir = fresh_folder("foreign");
  struct Case {
    Bytes bytes;
    std::string first, looks;
  };
  const std::vector<Case> cases = {
      {{'P', 'K', 3, 4, 20, 0, 0, 0, 8, 0}, "its first bytes are 50 4b 03 04 14 00 00 00", "a zip archive"},
      {{0xfd, '7', 'z', 'X', 'Z', 0, 0, 4}, "fd 37 7a 58 5a 00 00 04", "an xz archive"},
      {Bytes{'<', '!', 'D', 'O', 'C', 'T', 'Y', 'P', 'E', ' ', 'h', 't', 'm', 'l', '>'}, "3c 21 44 4f", "an HTML page"},
      {Bytes{'l', 'a', 'b', 'e', 'l', ',', 'x', '\n'}, "6c 61 62 65", ", text"},
      {{0x12, 0x34, 0x08, 0x01, 0, 0, 0, 1, 9}, "its first bytes are 12 34 08 01 00 00 00 01;", ""},
  };
  for (const Case& c : cases) {
    write_file(dir / "file", c.bytes);
    const std::string what = message_of([&] { read_idx((dir / "file").string()); });
    EXPECT_NE(what.find("is not an IDX file"), std::string::npos) << what;
    EXPECT_NE(what.find(c.first), std::string::npos) << what;
    EXPECT_NE(what.find(c.looks), std::string::npos) << what;
    EXPECT_EQ(what.find("gunzip"), std::string::npos) << "not gzip, so no gunzip advice: " << what;
  }
  // Inside a gzip file, the same check on the decompressed bytes.
  write_file(dir / "file", gzip({'h', 'e', 'l', 'l', 'o', '\n'}));
  EXPECT_THROW_MSG(read_idx((dir / "file").string()), Error, "(gzip, decompressed) is not an IDX file",
                   "68 65 6c 6c 6f 0a", ", text");
}

TEST(idx_test, truncated_and_overlong_files_are_found_plain_or_gzipped_with_memory_bounded_by_the_header) {
  const fs::path dir = fresh_folder("sizes");
  const fs::path p = dir / "f";
  const Bytes short_idx = idx({2, 3}, {1, 2, 3, 4});  // promises 6 data bytes, holds 4
  write_file(p, short_idx);
  EXPECT_THROW_MSG(read_idx(p.string()), Error, "has 4 data bytes, but its header (2 dimensions) promises 6",
                   "truncated");
  write_file(p, gzip(short_idx));
  EXPECT_THROW_MSG(read_idx(p.string()), Error, "(gzip, decompressed) has 4 data bytes", "promises 6", "truncated");
  write_file(p, gzip({0, 0, 8, 3, 0, 0}));  // a header cut inside the gzip
  EXPECT_THROW_MSG(read_idx(p.string()), Error, "(gzip, decompressed) is truncated: 3 dimensions need a 16-byte header");
  // 1 MB of zeros after a header promising 6 bytes: the reader stops at the first inflated chunk.
  Bytes overlong = idx({2, 3}, Bytes(1 << 20, 0));
  write_file(p, gzip(overlong));
  EXPECT_THROW_MSG(read_idx(p.string()), Error, "(gzip) decompresses to more than the 18 bytes its header promises",
                   "longer than its header says");
  // Sizes whose product overflows 64 bits.
  write_file(p, idx({0xffffffff, 0xffffffff, 0xffffffff}, {}));
  EXPECT_THROW_MSG(read_idx(p.string()), Error, "multiply past any file size");
}

// Seeded mutants of a plain and a gzipped IDX file (bytes flipped, cut, inserted): each read either gives
// an array whose size matches its dimensions or throws Error; nothing else (no crash, no other exception).
TEST(idx_test, mutants_of_plain_and_gzipped_files_read_consistently_or_throw_error) {
  const fs::path p = fresh_folder("mutants") / "f";
  std::mt19937 rng(20261124);
  int accepted = 0, refused = 0;
  for (const Bytes& original : {images_file(), gzip(images_file()), gzip(labels_file(), 0)}) {
    for (int i = 0; i < 400; ++i) {
      Bytes m = original;
      const int kind = static_cast<int>(rng() % 3);
      if (kind == 0) {
        for (int k = 0, n = 1 + static_cast<int>(rng() % 4); k < n; ++k) m[rng() % m.size()] ^= 1u << (rng() % 8);
      } else if (kind == 1) {
        m.resize(rng() % m.size());
      } else {
        m.insert(m.begin() + static_cast<std::ptrdiff_t>(rng() % m.size()), static_cast<std::uint8_t>(rng()));
      }
      write_file(p, m);
      try {
        const IdxArray a = read_idx(p.string());
        std::size_t count = 1;
        for (std::int64_t d : a.dims) count *= static_cast<std::size_t>(d);
        EXPECT_EQ(a.data.size(), count) << "mutant " << i;
        ++accepted;
      } catch (const Error&) {
        ++refused;
      }
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(accepted, 0) << "flips inside the pixels of a plain file leave a valid file";
}

}  // namespace
}  // namespace ampscope::samples
