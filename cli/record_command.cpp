// `ampscope record`: a PyTorch script run under the Python recorder, its rows written by trace::TraceWriter.
// The record layouts read here are written by python/ampscope/torch/_recorder.py (kProtocol there: PROTOCOL).
#include "cli/record_command.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <iostream>
#include <ostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/report_command.h"
#include "core/error.h"
#include "probes/trace/writer.h"

#ifndef AMPSCOPE_SOURCE_PYTHON_DIR
#define AMPSCOPE_SOURCE_PYTHON_DIR ""
#endif

namespace ampscope::samples {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::int64_t kProtocol = 1;

bool has_boot(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "ampscope" / "_boot" / "sitecustomize.py", ec);
}

// A record's field `i`, as the type wanted; a wrong type names the record's line and field.
struct Record {
  const json& a;
  std::int64_t line;

  [[noreturn]] void bad(std::size_t i, const char* wanted) const {
    throw Error(fmt::format("the recorder's record on line {} ('{}') has a field {} that is not {}", line,
                            a.size() > 0 && a[0].is_string() ? a[0].get<std::string>() : "?", i, wanted));
  }
  const json& at(std::size_t i) const {
    if (i >= a.size()) bad(i, "present");
    return a[i];
  }
  std::string text(std::size_t i) const {
    if (!at(i).is_string()) bad(i, "a string");
    return a[i].get<std::string>();
  }
  std::int64_t integer(std::size_t i) const {
    if (!at(i).is_number_integer()) bad(i, "an integer");
    return a[i].get<std::int64_t>();
  }
  bool flag(std::size_t i) const {
    if (!at(i).is_boolean()) bad(i, "true or false");
    return a[i].get<bool>();
  }
  double number(std::size_t i) const {
    const json& v = at(i);
    if (v.is_number()) return v.get<double>();
    if (v.is_string()) {
      const std::string s = v.get<std::string>();
      if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
      if (s == "inf") return std::numeric_limits<double>::infinity();
      if (s == "-inf") return -std::numeric_limits<double>::infinity();
    }
    bad(i, "a number");
  }
};

trace::OpRow op_row(const Record& r) {
  trace::OpRow row;
  row.step = r.integer(1);
  row.seq = r.integer(2);
  try {
    row.phase = trace::parse_phase(r.text(3));
  } catch (const std::exception&) {
    r.bad(3, "a phase (forward, backward, optimizer, scaler)");
  }
  row.op = r.text(4);
  row.module = r.text(5);
  row.in_dtypes = r.text(6);
  row.out_dtype = r.text(7);
  row.shape = r.text(8);
  row.autocast = r.text(9);
  trace::TensorHealth& h = row.health;
  h.numel = r.integer(10);
  h.nan = r.integer(11);
  h.pos_inf = r.integer(12);
  h.neg_inf = r.integer(13);
  h.zero = r.integer(14);
  h.subnormal = r.integer(15);
  h.min = r.number(16);
  h.max = r.number(17);
  h.absmax = r.number(18);
  h.mean = r.number(19);
  h.rms = r.number(20);
  row.cast_overflow = r.integer(21);
  row.cast_underflow = r.integer(22);
  row.origin = r.flag(23);
  const json& inputs = r.at(24);
  if (!inputs.is_array() || inputs.size() != trace::kOpInputs) r.bad(24, "a list of 4 integers");
  for (int i = 0; i < trace::kOpInputs; ++i) {
    if (!inputs[i].is_number_integer()) r.bad(24, "a list of 4 integers");
    row.inputs[i] = inputs[i].get<std::int64_t>();
  }
  return row;
}

trace::GradRow grad_row(const Record& r) {
  trace::GradRow row;
  row.step = r.integer(1);
  row.param = r.text(2);
  row.dtype = r.text(3);
  row.nan = r.integer(4);
  row.pos_inf = r.integer(5);
  row.neg_inf = r.integer(6);
  row.zero = r.integer(7);
  row.absmax = r.number(8);
  row.norm = r.number(9);
  row.unscaled = r.flag(10);
  return row;
}

trace::StepRow step_row(const Record& r) {
  trace::StepRow row;
  row.step = r.integer(1);
  row.loss = r.number(2);
  row.scale = r.number(3);
  row.scale_after = r.number(4);
  row.found_inf = r.flag(5);
  row.skipped = r.flag(6);
  row.growth_tracker = r.integer(7);
  row.grad_norm = r.number(8);
  row.lr = r.number(9);
  row.time_ms = r.number(10);
  return row;
}

// A row of the twin's /precision table (python/ampscope/torch/_twin.py; fields as trace::PrecisionRow).
trace::PrecisionRow precision_row(const Record& r) {
  trace::PrecisionRow row;
  row.step = r.integer(1);
  row.seq = r.integer(2);
  row.op = r.text(3);
  row.module = r.text(4);
  row.out_dtype = r.text(5);
  if (row.out_dtype != "f16" && row.out_dtype != "bf16" && row.out_dtype != "f32") r.bad(5, "f16, bf16 or f32");
  row.numel = r.integer(6);
  row.local = r.flag(7);
  row.local_max_rel = r.number(8);
  row.local_mean_rel = r.number(9);
  row.local_max_ulp = r.number(10);
  row.acc_max_rel = r.number(11);
  row.acc_mean_rel = r.number(12);
  row.acc_max_ulp = r.number(13);
  row.in_acc_max_rel = r.number(14);
  row.in_acc_mean_rel = r.number(15);
  row.flips = r.integer(16);
  row.bits = r.number(17);
  row.cond = r.number(18);
  row.followed = r.flag(19);
  const json& bins = r.at(20);
  if (!bins.is_array() || bins.size() != trace::kErrorBins) r.bad(20, fmt::format("a list of {} integers", trace::kErrorBins).c_str());
  for (int i = 0; i < trace::kErrorBins; ++i) {
    if (!bins[i].is_number_integer()) r.bad(20, "a list of integers");
    row.error_bins[i] = bins[i].get<std::int64_t>();
  }
  row.exact = r.integer(21);
  try {
    row.phase = trace::parse_phase(r.text(22));
  } catch (const std::exception&) {
    r.bad(22, "a phase (forward, backward)");
  }
  return row;
}

// A row of /histograms (level full): ["hist", step, seq (-1 for a gradient), tensor, [kHistBins counts]].
trace::HistogramRow histogram_row(const Record& r) {
  trace::HistogramRow row;
  row.step = r.integer(1);
  row.seq = r.integer(2);
  row.tensor = r.text(3);
  const json& bins = r.at(4);
  const std::string wanted = fmt::format("a list of {} counts >= 0", trace::kHistBins);
  if (!bins.is_array() || bins.size() != trace::kHistBins) r.bad(4, wanted.c_str());
  for (int i = 0; i < trace::kHistBins; ++i) {
    if (!bins[i].is_number_integer() || bins[i].get<std::int64_t>() < 0) r.bad(4, wanted.c_str());
    row.bins[i] = bins[i].get<std::int64_t>();
  }
  return row;
}

trace::EventRow event_row(const Record& r) {
  return trace::EventRow{r.integer(1), r.integer(2), r.text(3), r.text(4), r.text(5), r.text(6)};
}

// Reads the child's records and writes them, a whole step at a time.
class Receiver {
 public:
  explicit Receiver(const RecordRequest& request) : request_(request) {}

  void line(const std::string& text) {
    ++line_;
    json a;
    try {
      a = json::parse(text);
    } catch (const json::exception&) {
      throw Error(fmt::format("the recorder's record on line {} is not JSON: '{}'", line_, text.substr(0, 80)));
    }
    if (!a.is_array() || a.empty() || !a[0].is_string()) {
      throw Error(fmt::format("the recorder's record on line {} is not a list that starts with its kind", line_));
    }
    const std::string kind = a[0].get<std::string>();
    const Record r{a, line_};
    if (kind == "begin") {
      begin(r);
    } else if (kind == "end_step") {
      const std::int64_t step = r.integer(1);
      if (!writer_) throw Error(fmt::format("the recorder ended step {} before it sent the run's description", step));
      for (const json& p : pending_) write(Record{p, line_});
      pending_.clear();
      writer_->end_step(step);
      ++steps_;
    } else if (kind == "close") {
      closed_ = true;
    } else if (kind == "op" || kind == "grad" || kind == "step" || kind == "event" || kind == "precision" ||
               kind == "hist") {
      pending_.push_back(std::move(a));
    } else {
      throw Error(fmt::format("the recorder's record on line {} has an unknown kind '{}'", line_, kind));
    }
  }

  // The child is gone: close the trace (complete = 1 only when the recorder said the run ended cleanly and the
  // script succeeded). Returns the rows of an unfinished step that were dropped.
  std::size_t finish(bool clean) {
    const std::size_t dropped = pending_.size();
    pending_.clear();
    if (writer_) {
      if (clean && closed_) {
        writer_->close();
      } else {
        writer_.reset();  // complete stays 0: the run did not end normally
      }
    }
    return dropped;
  }

  std::int64_t steps() const { return steps_; }
  bool started() const { return began_; }
  bool closed() const { return closed_; }
  const std::string& path() const { return path_.empty() ? request_.out : path_; }

 private:
  void begin(const Record& r) {
    if (writer_) throw Error(fmt::format("the recorder described the run twice (line {})", line_));
    if (r.integer(1) != kProtocol) {
      throw Error(fmt::format("the recorder speaks protocol {}, this ampscope {}\nhint: use the ampscope Python "
                              "package installed with this program (AMPSCOPE_PYTHON_DIR overrides it)",
                              r.integer(1), kProtocol));
    }
    trace::RunInfo info{r.text(2), r.text(3), r.text(4), r.integer(5), r.text(6), r.text(7)};
    path_ = rank_path(request_.out, info.config);
    writer_ = std::make_unique<trace::TraceWriter>(path_, info);
    began_ = true;
  }

  // A rank of a torch.distributed run (its config carries "rank" and "world_size" > 1) writes OUT's
  // STEM.rankN.EXT, as `ampscope train --ddp` does, so report, diff and the viewer put the ranks together.
  static std::string rank_path(const std::string& out, const std::string& config_text) {
    const json config = json::parse(config_text, nullptr, false);
    if (!config.is_object() || !config.contains("rank") || !config.contains("world_size")) return out;
    if (!config["rank"].is_number_integer() || !config["world_size"].is_number_integer()) return out;
    const std::int64_t rank = config["rank"].get<std::int64_t>(), world = config["world_size"].get<std::int64_t>();
    if (world < 2 || rank < 0 || rank >= world) return out;
    const fs::path p(out);
    return (p.parent_path() / (p.stem().string() + fmt::format(".rank{}", rank) + p.extension().string())).string();
  }

  void write(const Record& r) {
    const std::string kind = r.a[0].get<std::string>();
    if (kind == "op") writer_->write(op_row(r));
    else if (kind == "grad") writer_->write(grad_row(r));
    else if (kind == "step") writer_->write(step_row(r));
    else if (kind == "precision") writer_->write(precision_row(r));
    else if (kind == "hist") writer_->write(histogram_row(r));
    else writer_->write(event_row(r));
  }

  const RecordRequest& request_;
  std::unique_ptr<trace::TraceWriter> writer_;
  std::vector<json> pending_;
  std::string path_;
  std::int64_t line_ = 0;
  std::int64_t steps_ = 0;
  bool closed_ = false;
  bool began_ = false;
};

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("exited with status {}", WEXITSTATUS(status));
}

}  // namespace

std::string find_python_dir(const std::string& program_path) {
  std::vector<fs::path> tried;
  if (const char* env = std::getenv("AMPSCOPE_PYTHON_DIR"); env != nullptr && *env != '\0') {
    if (has_boot(env)) return fs::absolute(env).string();
    throw Error(fmt::format("AMPSCOPE_PYTHON_DIR is '{}', which has no ampscope/_boot/sitecustomize.py\nhint: point "
                            "it at the folder that holds the ampscope Python package (the repository's python/)", env));
  }
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) exe = fs::absolute(program_path);
  const fs::path installed = exe.parent_path().parent_path() / "share" / "ampscope" / "python";
  tried.push_back(installed);
  if (has_boot(installed)) return installed.string();
  const fs::path source = AMPSCOPE_SOURCE_PYTHON_DIR;
  if (!source.empty()) {
    tried.push_back(source);
    if (has_boot(source)) return source.string();
  }
  std::string places;
  for (const fs::path& p : tried) places += (places.empty() ? "" : ", ") + p.string();
  throw Error(fmt::format("cannot find the ampscope Python package (looked in {})\nhint: set AMPSCOPE_PYTHON_DIR to "
                          "the folder that holds it (the repository's python/)", places));
}

namespace {

// Reads the recorder's lines from fd until its end; the first bad record is kept (and returned) while the rest is
// drained, so the writer is never blocked on a full pipe.
std::optional<Error> read_records(int fd, Receiver& receiver) {
  std::optional<Error> failure;
  std::string buffer;
  char chunk[1 << 16];
  for (;;) {
    const ssize_t n = read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (failure) continue;
    buffer.append(chunk, static_cast<std::size_t>(n));
    std::size_t start = 0;
    try {
      for (std::size_t nl; (nl = buffer.find('\n', start)) != std::string::npos; start = nl + 1) {
        receiver.line(buffer.substr(start, nl - start));
      }
    } catch (const Error& e) {
      failure = e;
    }
    buffer.erase(0, start);
  }
  return failure;
}

// --attach: the rows of a process that recorded itself (ampscope.torch.record(), docs/pytorch.md) arrive on
// stdin; 0 when the recorder closed the run, 1 when its input ended without the close (the process died).
int run_attached(const RecordRequest& request, std::ostream& err) {
  struct sigaction ignore {}, saved_int {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGINT, &ignore, &saved_int);  // Ctrl-C is the Python process's; this one closes the trace
  Receiver receiver(request);
  const std::optional<Error> failure = read_records(0, receiver);
  sigaction(SIGINT, &saved_int, nullptr);
  const bool clean = receiver.closed() && !failure;
  const std::size_t dropped = receiver.finish(clean);
  if (failure) throw *failure;
  if (!receiver.started()) {
    err << "ampscope record: the recorded process ended before it finished a step: no trace written\nhint: a step "
           "ends with the optimizer's step() (or ampscope.torch.end_step())\n";
    return kExitUsage;
  }
  if (clean) {
    err << fmt::format("ampscope record: {} step{} written to {}\n", receiver.steps(), receiver.steps() == 1 ? "" : "s",
                       receiver.path());
    return 0;
  }
  err << fmt::format("ampscope record: the recorded process ended without closing the run; {} finished step{} kept "
                     "in {} (complete = 0){}\n", receiver.steps(), receiver.steps() == 1 ? "" : "s", receiver.path(),
                     dropped > 0 ? fmt::format(", {} rows of the unfinished step dropped", dropped) : "");
  return 1;
}

}  // namespace

std::vector<std::string> remedy_arguments(const RecordRequest& request) {
  std::vector<std::string> args;
  for (const std::string& glob : request.autocast_fp32) args.insert(args.end(), {"--autocast-fp32", glob});
  if (!request.autocast.empty()) args.insert(args.end(), {"--autocast", request.autocast});
  if (!std::isnan(request.init_scale)) args.insert(args.end(), {"--init-scale", fmt::format("{}", request.init_scale)});
  if (request.growth_interval > 0) {
    args.insert(args.end(), {"--growth-interval", std::to_string(request.growth_interval)});
  }
  if (!std::isnan(request.lr_factor)) args.insert(args.end(), {"--lr-factor", fmt::format("{}", request.lr_factor)});
  if (request.stop_after >= 0) args.insert(args.end(), {"--stop-after", std::to_string(request.stop_after)});
  return args;
}

namespace {

// The remedy options, checked, as the recorder reads them (AMPSCOPE_RECORD_OPTIONS["remedies"]).
json remedy_options(const RecordRequest& request) {
  json r = json::object();
  for (const std::string& glob : request.autocast_fp32) {
    if (glob.empty()) {
      throw Error("--autocast-fp32 '': an empty module glob\nhint: name a module path as the report names it: "
                  "--autocast-fp32 criterion, or --autocast-fp32 'blocks.*.attn'");
    }
  }
  if (!request.autocast_fp32.empty()) r["autocast_fp32"] = request.autocast_fp32;
  if (!request.autocast.empty()) {
    if (request.autocast != "bf16" && request.autocast != "off") {
      throw Error(fmt::format("--autocast {}: expected bf16 (f16 autocast regions run in bf16) or off (autocast "
                              "disabled: the f32 reference)", request.autocast));
    }
    r["autocast"] = request.autocast;
  }
  if (!std::isnan(request.init_scale)) {
    if (!std::isfinite(request.init_scale) || request.init_scale <= 0) {
      throw Error(fmt::format("--init-scale {}: expected a finite number > 0", request.init_scale));
    }
    r["init_scale"] = request.init_scale;
  }
  if (request.growth_interval < 0) {
    throw Error(fmt::format("--growth-interval {}: expected an integer >= 1", request.growth_interval));
  }
  if (request.growth_interval > 0) r["growth_interval"] = request.growth_interval;
  if (!std::isnan(request.lr_factor)) {
    if (!std::isfinite(request.lr_factor) || request.lr_factor <= 0) {
      throw Error(fmt::format("--lr-factor {}: expected a finite number > 0 (0.1 runs at a tenth of the script's "
                              "learning rate)", request.lr_factor));
    }
    r["lr_factor"] = request.lr_factor;
  }
  if (request.stop_after < -1) throw Error(fmt::format("--stop-after {}: expected a step >= 0", request.stop_after));
  if (request.stop_after >= 0) r["stop_after"] = request.stop_after;
  return r;
}

}  // namespace

int run_record(const RecordRequest& request, std::ostream& err) {
  if (request.attach && !request.command.empty()) {
    throw Error("--attach reads the rows of a running Python process on stdin: no command is run\nhint: leave out "
                "the command after --, or leave out --attach");
  }
  if (request.command.empty() && !request.attach) {
    throw Error("no command to record\nhint: ampscope record --out run.h5 -- python3 train.py ARGS...");
  }
  if (request.probe != "off" && request.probe != "dtype" && request.probe != "health" && request.probe != "full") {
    throw Error(fmt::format("--probe {}: unknown probe level\nhint: the levels are off (/steps only), dtype (rows "
                            "without statistics), health (the default) and full (health and exponent histograms)",
                            request.probe));
  }
  for (const std::string& glob : request.ops) {
    if (glob.empty()) {
      throw Error("--ops '': an empty glob matches no op\nhint: name ops as the report names them: --ops linear --ops "
                  "'soft*' (an empty --modules '' is allowed: the ops outside every module)");
    }
  }
  if (request.sample_every < 1) {
    throw Error(fmt::format("--sample-every {}: must be 1 or more\nhint: --sample-every 10 records the ops of every "
                            "tenth step", request.sample_every));
  }
  if (request.flight_recorder < 0) {
    throw Error(fmt::format("--flight-recorder {}: must be 0 (off) or more\nhint: --flight-recorder 4 writes an "
                            "anomalous unsampled step with the 3 steps before it", request.flight_recorder));
  }
  if (request.flight_recorder > 0 && (request.sample_every < 2 || request.probe == "off")) {
    throw Error(fmt::format("--flight-recorder {} keeps the steps that sampling leaves out, but {}\nhint: add "
                            "--sample-every N (N of 2 or more) and a --probe level other than off, or leave "
                            "--flight-recorder out", request.flight_recorder,
                            request.probe == "off" ? "--probe off records no ops"
                                                   : "--sample-every 1 records every step already"));
  }
  const json remedies = remedy_options(request);
  if (request.attach) {
    if (!remedies.empty()) {
      throw Error("--attach records a process that started itself: the remedy options (--autocast-fp32, --autocast, "
                  "--init-scale, --growth-interval, --lr-factor, --stop-after) apply only to a command ampscope runs\n"
                  "hint: leave them out, or run the script as ampscope record --out run.h5 [OPTIONS] -- python3 SCRIPT");
    }
    return run_attached(request, err);
  }
  const std::string python_dir = request.python_dir;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw Error(fmt::format("cannot create a pipe: {}", std::strerror(errno)));
  json options = {{"probe", request.probe},       {"sample_every", request.sample_every}, {"ops", request.ops},
                  {"modules", request.modules},   {"record_optimizer", request.record_optimizer},
                  {"flight_recorder", request.flight_recorder}};
  // What `ampscope fix` needs to run the script again, kept in the trace's config by the recorder: the command
  // as it was given, the folder it ran in, and the kept environment variables (kKeptEnvironment).
  options["command"] = request.command;
  options["cwd"] = request.cwd.empty() ? fs::current_path().string() : request.cwd;
  json env = json::object();
  for (const char* name : kKeptEnvironment) {
    if (const char* value = std::getenv(name); value != nullptr) env[name] = value;
  }
  for (const auto& [name, value] : request.env) env[name] = value;
  options["env"] = env;
  if (!remedies.empty()) options["remedies"] = remedies;
  if (request.twin) options["twin"] = true;
  const std::string boot = (fs::path(python_dir) / "ampscope" / "_boot").string();
  std::string pythonpath = boot + ":" + python_dir;
  if (const char* old = std::getenv("PYTHONPATH"); old != nullptr && *old != '\0') pythonpath += std::string(":") + old;

  const pid_t child = fork();
  if (child < 0) throw Error(fmt::format("cannot start '{}': {}", request.command[0], std::strerror(errno)));
  if (child == 0) {
    // The write end stays open across exec; the read end closes (O_CLOEXEC).
    const int w = dup(fds[1]);  // without O_CLOEXEC
    setenv("AMPSCOPE_RECORD_FD", std::to_string(w).c_str(), 1);
    setenv("AMPSCOPE_RECORD_OPTIONS", options.dump().c_str(), 1);
    setenv("PYTHONPATH", pythonpath.c_str(), 1);
    for (const auto& [name, value] : request.env) setenv(name.c_str(), value.c_str(), 1);
    if (request.stdout_to_stderr) dup2(2, 1);
    if (!request.cwd.empty() && chdir(request.cwd.c_str()) != 0) {
      const std::string msg = fmt::format("ampscope record: error: cannot enter the folder '{}': {}\n", request.cwd,
                                          std::strerror(errno));
      [[maybe_unused]] const ssize_t n = write(2, msg.data(), msg.size());
      _exit(127);
    }
    std::vector<char*> argv;
    for (const std::string& a : request.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    const std::string msg = fmt::format("ampscope record: error: cannot run '{}': {}\nhint: the command after -- is "
                                        "run as it is: python3 train.py ARGS...\n", request.command[0],
                                        std::strerror(errno));
    [[maybe_unused]] const ssize_t n = write(2, msg.data(), msg.size());
    _exit(127);
  }
  close(fds[1]);
  // Ctrl-C reaches the script (same process group); this process lives on to close the trace.
  struct sigaction ignore {}, saved_int {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGINT, &ignore, &saved_int);

  Receiver receiver(request);
  const std::optional<Error> failure = read_records(fds[0], receiver);
  close(fds[0]);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  sigaction(SIGINT, &saved_int, nullptr);
  const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0 && !failure;
  const std::size_t dropped = receiver.finish(clean);
  const int result = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  if (failure) throw *failure;
  if (!receiver.started()) {
    err << fmt::format("ampscope record: the script {} before it finished a step: no trace written\nhint: a step "
                       "ends with the optimizer's step() (or ampscope.torch.end_step()); is it a Python script run by "
                       "an interpreter with torch?\n", describe_status(status));
    return result == 0 ? kExitUsage : result;
  }
  if (clean) {
    err << fmt::format("ampscope record: {} step{} written to {}\n", receiver.steps(), receiver.steps() == 1 ? "" : "s",
                       receiver.path());
  } else {
    err << fmt::format("ampscope record: the script {}; {} finished step{} kept in {} (complete = 0){}\n",
                       describe_status(status), receiver.steps(), receiver.steps() == 1 ? "" : "s", receiver.path(),
                       dropped > 0 ? fmt::format(", {} rows of the unfinished step dropped", dropped) : "");
  }
  return result;
}

RecordCommand::RecordCommand(CLI::App& app) {
  cmd_ = app.add_subcommand("record", "Record an unmodified PyTorch training script: ampscope record --out run.h5 -- "
                                      "python3 train.py ARGS... (docs/pytorch.md)");
  cmd_->add_option("--out", request_.out, "The trace to write (HDF5)")->required();
  cmd_->add_option("--probe", request_.probe, "What to record per op: off (no op or gradient rows: /steps only), "
                                             "dtype (rows without statistics), health (counts and moments of every "
                                             "output), full (health and exponent histograms, /histograms)")
      ->capture_default_str();
  cmd_->add_option("--sample-every", request_.sample_every, "Record the ops and gradients of every Nth step (/steps "
                                                            "is written every step; the other steps run with no "
                                                            "recorder between their ops, unless "
                                                            "--flight-recorder)")
      ->capture_default_str();
  cmd_->add_option("--ops", request_.ops, "Record only the ops whose name matches this glob (repeatable; as the "
                                          "report names them: linear, softmax, 'layer_*')")
      ->allow_extra_args(false);  // one glob per occurrence: a list must not swallow the `--` before the command
  cmd_->add_option("--modules", request_.modules, "Record only the ops whose module path matches this glob "
                                                  "(repeatable; * matches dots too: 'blocks.*.attn*'); also selects "
                                                  "/grads by the parameter's module")
      ->allow_extra_args(false);
  cmd_->add_flag("--record-optimizer", request_.record_optimizer, "Record the optimizer's own ops (and gradient "
                                                                  "clipping's) as optimizer-phase rows; left out "
                                                                  "by default: on an AdamW transformer they cost "
                                                                  "more than all the other rows together");
  cmd_->add_option("--flight-recorder", request_.flight_recorder, "With --sample-every: record every step and "
                                                                  "keep the last N in memory; an unsampled step "
                                                                  "with an anomaly (NaN/inf in an op or gradient, "
                                                                  "a skipped step) is written with the N - 1 steps "
                                                                  "before it (0: off; with it every step costs "
                                                                  "what a recorded step costs)")
      ->capture_default_str();
  cmd_->add_flag("--attach", request_.attach, "Read the rows of a Python process that records itself on stdin (run "
                                             "by ampscope.torch.record(); no command)");
  // Remedies applied from outside the script (docs/pytorch.md, "Proving a fix"): what `ampscope fix` re-runs with.
  cmd_->add_option("--autocast-fp32", request_.autocast_fp32, "Run the modules whose path matches this glob with "
                                                              "autocast disabled and f32 inputs (repeatable)")
      ->allow_extra_args(false);
  cmd_->add_option("--autocast", request_.autocast, "bf16: autocast regions that ask for f16 get bf16; off: every "
                                                    "autocast region disabled (the f32 reference)");
  cmd_->add_option("--init-scale", request_.init_scale, "Every GradScaler's initial scale");
  cmd_->add_option("--growth-interval", request_.growth_interval, "Every GradScaler's growth interval");
  cmd_->add_option("--lr-factor", request_.lr_factor, "Multiply every optimizer's learning rate by this factor");
  cmd_->add_flag("--twin", request_.twin, "Compute every recorded f16/bf16 forward op again in f32 and write its "
                                         "errors to /precision (docs/pytorch.md, \"Where precision went\")");
  cmd_->add_option("--stop-after", request_.stop_after, "End the script (status 0) after this step");
  cmd_->add_option("command", request_.command, "The command to run, after --: python3 train.py ARGS...");
}

bool RecordCommand::parsed() const { return cmd_->parsed(); }

int RecordCommand::run(const char* program_path) {
  if (request_.python_dir.empty()) request_.python_dir = find_python_dir(program_path);
  return run_record(request_, std::cerr);
}

}  // namespace ampscope::samples
