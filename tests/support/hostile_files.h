// tests/support/hostile_files.h: what the tests of the readers of files from elsewhere (model folders, token
// and tokenizer files, --text) share: FIFOs and device links put where a file belongs, JSON nested a million
// levels deep, and a way to call a reader that fails the test, rather than hanging it, when the reader blocks.
//
//   const fs::path fifo = testing::make_fifo(dir / "config.json");
//   const std::string message = testing::refusal_within<ModelError>([&] { hf::load_model(dir); }, {fifo});
//   EXPECT_NE(message.find("FIFO"), std::string::npos) << message;
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace ampscope::testing {

// A FIFO (named pipe) at `path` (anything there before is removed). Reading it blocks until a writer comes.
inline std::filesystem::path make_fifo(const std::filesystem::path& path) {
  std::filesystem::remove_all(path);
  if (::mkfifo(path.c_str(), 0600) != 0) ADD_FAILURE() << "mkfifo " << path << " failed";
  return path;
}

// A symbolic link at `path` to `target` (e.g. /dev/zero, a device that never ends).
inline std::filesystem::path make_link(const std::filesystem::path& path, const std::filesystem::path& target) {
  std::filesystem::remove_all(path);
  std::filesystem::create_symlink(target, path);
  return path;
}

// JSON nested `levels` deep and never closed (so also a syntax error if read to the end; a reader must
// refuse it by its depth first, without recursing): `levels` times '[', or with objects `levels` times
// {"a": (5 bytes each).
inline std::string deep_json(std::size_t levels) { return std::string(levels, '['); }
inline std::string deep_json_objects(std::size_t levels) {
  std::string s;
  s.reserve(levels * 5);
  for (std::size_t i = 0; i < levels; ++i) s += "{\"a\":";
  return s;
}

// Calls `read` on another thread and returns the message of the Refusal it throws ("" when it returns, with
// a test failure, as for any other exception). When it has not finished after `seconds`, it is blocked
// (in open() or read() of a FIFO): the test fails, and each of `fifos` is opened for writing and closed, which
// ends any read blocked on it, so the test can go on.
template <class Refusal>
std::string refusal_within(const std::function<void()>& read, const std::vector<std::filesystem::path>& fifos = {},
                           double seconds = 20.0) {
  auto result = std::async(std::launch::async, [&]() -> std::string {
    try {
      read();
    } catch (const Refusal& e) {
      return e.what();
    } catch (const std::exception& e) {
      return std::string("UNEXPECTED EXCEPTION: ") + e.what();
    }
    return "RETURNED";
  });
  if (result.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) {
    ADD_FAILURE() << "the reader blocked for more than " << seconds << " s (a FIFO opened or read?)";
    for (int round = 0; round < 100 && result.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready;
         ++round) {
      for (const auto& f : fifos) {
        const int fd = ::open(f.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (fd >= 0) ::close(fd);
      }
    }
  }
  const std::string message = result.get();
  EXPECT_NE(message, "RETURNED") << "the reader accepted the file";
  EXPECT_EQ(message.rfind("UNEXPECTED EXCEPTION", 0), std::string::npos) << message;
  return message;
}

}  // namespace ampscope::testing
