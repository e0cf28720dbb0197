// `ampscope tokenize --model DIR FILE [--tokens OUT]` (issue 31): the ids printed are the ones GPT-2's own
// machinery makes (gpt2_reference.py: the `regex` module and GPT-2's merge rounds, as in
// gpt2_regex_reference_test.cpp) from the folder's files; the token files written read back through numpy and
// through `--tokens`, and a run on them is the run on `--text FILE`; bad inputs and outputs are refused by name.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "cli/run.h"
#include "cli/tokenize_command.h"
#include "core/error.h"
#include "core/random.h"
#include "models/hf_models.h"
#include "models/token_data.h"
#include "samples/task.h"
#include <nlohmann/json.hpp>
#include "tests/tokenizer/tokenizer_files.h"

namespace ampscope {
namespace {

namespace fs = std::filesystem;
using samples::run_tokenize;
using samples::TokenizeRequest;

std::string hex(const std::string& s) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

// The texts: words the merges join, UTF-8 of three lengths, runs of spaces and newlines, digits, contractions
// and bytes that are not UTF-8; long enough for a window of 8 tokens.
std::vector<std::string> texts() {
  return {"Hello world, the caf\xc3\xa9 12!! It's   the world.\n\nhello\n",
          "\xe6\x97\xa5\xe6\x97\xa5 the 1234 world's \x80\xff caf\xc3\xa9  \t the!!! 'll 've\n",
          " the the the the the the the the the the the the the the the the the the the the"};
}

// The reference's ids of each text, one vector per text; empty when /usr/bin/python3 lacks the regex module.
std::vector<std::vector<std::int32_t>> reference_ids(const fs::path& dir, const std::vector<std::string>& xs) {
  {
    std::ofstream out(dir / "texts.hex");
    for (const auto& x : xs) out << hex(x) << "\n";
  }
  const fs::path script = fs::path(AMPSCOPE_SOURCE_DIR) / "tests" / "tokenizer" / "gpt2_reference.py";
  const std::string cmd = "/usr/bin/python3 '" + script.string() + "' '" + (dir / "vocab.json").string() + "' '" +
                          (dir / "merges.txt").string() + "' '" + (dir / "texts.hex").string() + "' '" +
                          (dir / "reference.txt").string() + "'";
  const int rc = std::system(cmd.c_str());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 3) return {};
  EXPECT_EQ(rc, 0) << cmd;
  std::ifstream in(dir / "reference.txt");
  std::vector<std::vector<std::int32_t>> all;
  for (std::string pieces, ids; std::getline(in, pieces) && std::getline(in, ids);) {
    std::istringstream fields(ids.substr(1));
    std::vector<std::int32_t> v;
    for (std::int32_t id; fields >> id;) v.push_back(id);
    all.push_back(v);
  }
  return all;
}

std::vector<std::int32_t> parse_ids(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::int32_t> v;
  for (std::int32_t id; in >> id;) v.push_back(id);
  return v;
}

std::string tokenize(const TokenizeRequest& r) {
  std::ostringstream out;
  EXPECT_EQ(run_tokenize(r, out), 0);
  return out.str();
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

TEST(tokenize_command_test, prints_the_ids_gpt2s_own_encoder_makes_and_writes_token_files_train_reads) {
  if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "/usr/bin/python3 is not installed";
  const fs::path dir = testing::write_gpt2_files(testing::full_byte_vocab(), "tokenize_command");
  const std::vector<std::string> xs = texts();
  const auto expected = reference_ids(dir, xs);
  if (expected.empty())
    GTEST_SKIP() << "/usr/bin/python3 has no regex module (Debian's python3-regex; scripts/setup.sh installs it)";
  ASSERT_EQ(expected.size(), xs.size());
  for (std::size_t k = 0; k < xs.size(); ++k) {
    SCOPED_TRACE("text " + std::to_string(k));
    const fs::path text = dir / ("text" + std::to_string(k) + ".txt");
    testing::write_text(text, xs[k]);
    const std::string printed = tokenize({.model = dir.string(), .text = text.string()});
    // One line of space-separated ids.
    ASSERT_FALSE(printed.empty());
    EXPECT_EQ(printed.back(), '\n');
    EXPECT_EQ(std::count(printed.begin(), printed.end(), '\n'), 1);
    EXPECT_EQ(printed.find("  "), std::string::npos);
    EXPECT_EQ(parse_ids(printed), expected[k]);
  }

  // The token files: each format read back by numpy (the independent reader) and by --tokens' reader.
  const fs::path text = dir / "text0.txt";
  for (const char* ext : {".txt", ".npy", ".bin"}) {
    SCOPED_TRACE(ext);
    const fs::path out = dir / (std::string("ids") + ext);
    EXPECT_EQ(tokenize({.model = dir.string(), .text = text.string(), .tokens = out.string()}), "");
    EXPECT_EQ(samples::load_tokens(out), expected[0]);
    const std::string load = std::string(ext) == ".npy"   ? "numpy.load(p)"
                             : std::string(ext) == ".bin" ? "numpy.fromfile(p, dtype=numpy.uint16)"
                                                          : "numpy.loadtxt(p, dtype=numpy.int64, ndmin=1)";
    const fs::path numpy_out = dir / (std::string("numpy") + ext + ".out");
    const std::string cmd = "/usr/bin/python3 -c \"import numpy, sys; p = sys.argv[1]; "
                            "open(sys.argv[2], 'w').write(' '.join(str(int(i)) for i in " +
                            load + "))\" '" + out.string() + "' '" + numpy_out.string() + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    EXPECT_EQ(parse_ids(read_all(numpy_out)), expected[0]);
  }
  EXPECT_EQ(read_all(dir / "ids.txt"), tokenize({.model = dir.string(), .text = text.string()}));

  // Round trip: a run on the written file is the run on --text (the same ids, windows, losses).
  {
    const std::int64_t vocab = samples::BpeTokenizer::from_folder(dir).vocab_size();
    Generator gen(3);
    const nlohmann::json config = {{"model_type", "gpt2"}, {"vocab_size", vocab}, {"n_positions", 16},
                                   {"n_embd", 16},         {"n_layer", 1},        {"n_head", 2},
                                   {"layer_norm_epsilon", 1e-5}, {"activation_function", "gelu_new"},
                                   {"initializer_range", 0.02}};
    samples::hf::save_model(*samples::hf::make_model(config, gen), dir);
    auto run = [&](const std::string& tokens, const std::string& text_file) {
      samples::TrainConfig c;
      c.model_dir = dir.string();
      c.tokens_file = tokens;
      c.text_file = text_file;
      c.precision = samples::Precision::fp32;
      c.steps = 2;
      c.batch = 1;
      c.context = 8;
      c.device = "cpu";
      return samples::train(c).losses;
    };
    const std::vector<double> by_text = run("", text.string());
    ASSERT_EQ(by_text.size(), 2u);
    for (const char* ext : {".txt", ".npy", ".bin"}) EXPECT_EQ(run((dir / (std::string("ids") + ext)).string(), ""), by_text) << ext;
  }
}

TEST(tokenize_command_test, bad_inputs_and_outputs_are_refused_naming_them) {
  const fs::path dir = testing::write_gpt2_files(testing::full_byte_vocab(), "tokenize_refusals");
  const fs::path text = dir / "text.txt";
  testing::write_text(text, "hello world");
  const std::string model = dir.string();
  auto refused = [&](const TokenizeRequest& r, const std::string& message) {
    std::ostringstream out;
    try {
      run_tokenize(r, out);
      ADD_FAILURE() << "not refused; expected: " << message;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
    EXPECT_EQ(out.str(), "");
  };
  // An existing token file: refused, then replaced with --overwrite.
  const fs::path out = dir / "ids.txt";
  testing::write_text(out, "1 2 3\n");
  refused({.model = model, .text = text.string(), .tokens = out.string()},
          "--tokens '" + out.string() + "' exists; refusing to overwrite it\nhint: give another --tokens file, or "
          "--overwrite to replace it");
  EXPECT_EQ(read_all(out), "1 2 3\n");
  tokenize({.model = model, .text = text.string(), .tokens = out.string(), .overwrite = true});
  EXPECT_EQ(read_all(out), tokenize({.model = model, .text = text.string()}));
  // A link under OUT is never written through, --overwrite or not; the file it points at is unchanged.
  const fs::path victim = dir / "victim.txt", link = dir / "link.txt";
  testing::write_text(victim, "keep me");
  fs::create_symlink(victim, link);
  refused({.model = model, .text = text.string(), .tokens = link.string(), .overwrite = true},
          "--tokens '" + link.string() + "' is a symbolic link (to '" + victim.string() +
              "'); ampscope never writes through a link, which could overwrite whatever it points at\nhint: remove the "
              "link (a file that came with a trace may point anywhere), or write elsewhere");
  EXPECT_EQ(read_all(victim), "keep me");
  // An extension no token reader knows.
  refused({.model = model, .text = text.string(), .tokens = (dir / "ids.csv").string()},
          "--tokens '" + (dir / "ids.csv").string() + "': the extension '.csv' is not a token file's; the token files "
          "`--tokens` reads are .txt (ids separated by spaces), .npy (int32) and .bin (uint16, as nanoGPT writes)\n"
          "hint: name the file with one of those extensions");
  EXPECT_FALSE(fs::exists(dir / "ids.csv"));
  // A missing text file, a FIFO (refused before open(), which would block), a folder.
  refused({.model = model, .text = (dir / "missing.txt").string()},
          "text file '" + (dir / "missing.txt").string() + "': cannot open it: No such file or directory\nhint: give a "
          "regular file of text to tokenize (UTF-8 or any bytes)");
  const fs::path fifo = dir / "fifo.txt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  refused({.model = model, .text = fifo.string()},
          "text file '" + fifo.string() + "': not a regular file: it is a FIFO (named pipe)\nhint: give a regular file "
          "of text to tokenize (UTF-8 or any bytes)");
  // A folder without a tokenizer.
  const fs::path bare = dir / "bare";
  fs::create_directories(bare);
  refused({.model = bare.string(), .text = text.string()},
          "'" + bare.string() + "' has no tokenizer that --text reads: neither tokenizer.json nor vocab.json + "
          "merges.txt\nhint: --text needs vocab.json + merges.txt, or tokenizer.json; otherwise tokenize the text "
          "yourself and pass the ids with --tokens");
  // An id a .bin file (uint16) cannot hold.
  EXPECT_THROW_MSG(samples::token_file_bytes("x.bin", {1, 65535, 65536}), Error,
                   "--tokens 'x.bin': id 65536 (position 2) does not fit a .bin file, whose ids are uint16 (0 to "
                   "65535)\nhint: write a .npy file (int32) or a .txt file instead");
}

}  // namespace
}  // namespace ampscope
