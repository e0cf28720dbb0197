// A data-parallel run's rank traces (probes/analysis/ranks.h): finding them, a trace's rank, two ranks of one
// run checked for what must be identical, and two N-rank runs diffed rank by rank.
#include "probes/analysis/ranks.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <regex>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "probes/trace/writer.h"

namespace ampscope::analysis {
namespace {

using ordered_json = nlohmann::ordered_json;

// The config as JSON, or a discarded value when it is not JSON.
nlohmann::json parse_config(const std::string& text) { return nlohmann::json::parse(text, nullptr, false); }

// Exact text of a double: the shortest that reads back to the same bits; "NaN", "inf", "-inf".
std::string exact(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return fmt::format("{}", x);
}

// Equal as the same value: NaN equals NaN (the same "no finite value"), +0 equals -0.
bool same(double x, double y) { return x == y || (std::isnan(x) && std::isnan(y)); }

std::string counts_text(const trace::GradRow& g) {
  return fmt::format("NaN {}, +inf {}, -inf {}, zeros {}", g.nan, g.pos_inf, g.neg_inf, g.zero);
}

// Where in a step a divergence happens: the forward pass, the loss it ends in, the backward pass, the
// gradients it leaves (after the all-reduce), then the optimizer and the scaler.
int stage_of(const RankDivergence& d) {
  if (d.kind == "loss") return 1;
  if (d.kind == "gradient") return 3;
  switch (d.phase) {
    case trace::Phase::forward: return 0;
    case trace::Phase::backward: return 2;
    case trace::Phase::optimizer: return 4;
    case trace::Phase::scaler: return 5;
  }
  return 6;
}

auto order_key(const RankDivergence& d) { return std::make_tuple(d.step, stage_of(d), d.seq); }

std::string nonfinite_text(std::int64_t nan, std::int64_t pos_inf, std::int64_t neg_inf) {
  std::vector<std::string> parts;
  if (nan > 0) parts.push_back(fmt::format("{} NaN", nan));
  if (pos_inf > 0) parts.push_back(fmt::format("{} +inf", pos_inf));
  if (neg_inf > 0) parts.push_back(fmt::format("{} -inf", neg_inf));
  return parts.empty() ? std::string("none") : fmt::format("{}", fmt::join(parts, ", "));
}

std::string num(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return fmt::format("{:.4g}", x);
}

std::string place_of(const RankDivergence& d) {
  if (d.kind == "loss") return "the loss";
  if (d.kind == "gradient") return fmt::format("the gradient of {}", d.param);
  return fmt::format("{} {} in {}", trace::phase_name(d.phase), d.op, d.module.empty() ? "(no module)" : d.module);
}

std::string step_text(const RankDivergence& d) {
  return d.step == d.step_b ? fmt::format("step {}", d.step) : fmt::format("step {} (b's step {})", d.step, d.step_b);
}

// The ranks of one side: each trace's rank, checked to be 0 .. N-1 of one run of N ranks; the paths by rank.
std::vector<std::string> by_rank(const std::vector<std::string>& paths, const char* side) {
  std::vector<std::string> out(paths.size());
  int world = -1;
  std::optional<trace::RunInfo> first;
  for (const std::string& path : paths) {
    trace::TraceReader reader(path);
    const std::optional<RankPlace> place = rank_place(reader.run_info());
    if (!place) {
      throw Error(fmt::format("'{}' (run {}) is not a trace of a data-parallel run (its config has no rank and "
                              "world_size)\nhint: give the traces `ampscope train --ddp --out` wrote (NAME.rank0.h5, "
                              "NAME.rank1.h5, ...), or NAME.h5 for all of them",
                              path, side));
    }
    if (world >= 0 && place->world_size != world) {
      throw Error(fmt::format("the traces of run {} are not of one run: '{}' is rank {} of {}, the others of {}",
                              side, path, place->rank, place->world_size, world));
    }
    world = place->world_size;
    if (!first) {
      first = reader.run_info();
    } else if (!same_run(*first, reader.run_info())) {
      throw Error(fmt::format("the traces of run {} are not of one run: '{}' has another configuration than '{}' (they "
                              "differ beyond rank and device)",
                              side, path, paths.front()));
    }
    if (place->rank < 0 || place->rank >= static_cast<int>(paths.size()) || !out[static_cast<std::size_t>(place->rank)].empty()) {
      throw Error(fmt::format("the traces of run {} are not ranks 0 to {} of one run ('{}' is rank {} of {})\nhint: "
                              "give every rank's trace once, or one name whose siblings are found",
                              side, paths.size() - 1, path, place->rank, place->world_size));
    }
    out[static_cast<std::size_t>(place->rank)] = path;
  }
  if (world != static_cast<int>(paths.size())) {
    throw Error(fmt::format("run {} was trained on {} ranks, but {} of its traces were found ({})\nhint: every "
                            "rank's trace must be beside the others, named NAME.rankR.h5",
                            side, world, paths.size(), fmt::join(paths, ", ")));
  }
  return out;
}

ordered_json divergence_json(const std::optional<RankDivergence>& d) {
  if (!d) return nullptr;
  ordered_json j;
  j["rank"] = d->rank;
  j["step"] = d->step;
  j["step_b"] = d->step_b;
  j["kind"] = d->kind;
  j["phase"] = d->kind == "op" ? ordered_json(std::string(trace::phase_name(d->phase))) : ordered_json(nullptr);
  j["seq"] = d->kind == "op" ? ordered_json(d->seq) : ordered_json(nullptr);
  j["module"] = d->module;
  j["op"] = d->op;
  j["param"] = d->param;
  j["stat"] = d->stat;
  j["detail"] = d->detail;
  return j;
}

}  // namespace

std::vector<std::string> rank_siblings(const std::vector<std::string>& given) {
  if (given.size() > 1) return given;
  if (given.empty()) return {};
  const std::filesystem::path p(given.front());
  std::string stem = p.stem().string();
  static const std::regex kRankStem(R"((.*)\.rank[0-9]+)");
  std::smatch m;
  if (std::regex_match(stem, m, kRankStem)) {
    stem = m[1].str();
  } else if (std::filesystem::exists(p)) {
    return {};  // an ordinary trace
  }
  auto sibling = [&](int r) { return (p.parent_path() / fmt::format("{}.rank{}{}", stem, r, p.extension().string())).string(); };
  std::vector<std::string> found;
  for (int r = 0; std::filesystem::exists(sibling(r)); ++r) found.push_back(sibling(r));
  return found.size() >= 2 ? found : std::vector<std::string>{};
}

std::optional<RankPlace> rank_place(const trace::RunInfo& run) {
  const nlohmann::json config = parse_config(run.config);
  if (config.is_discarded() || !config.is_object()) return std::nullopt;
  const auto rank = config.find("rank"), world = config.find("world_size");
  if (rank == config.end() || world == config.end() || !rank->is_number_integer() || !world->is_number_integer())
    return std::nullopt;
  return RankPlace{rank->get<int>(), world->get<int>()};
}

bool same_run(const trace::RunInfo& a, const trace::RunInfo& b) {
  const std::optional<RankPlace> pa = rank_place(a), pb = rank_place(b);
  if (!pa || !pb || pa->world_size != pb->world_size) return false;
  nlohmann::json ca = parse_config(a.config), cb = parse_config(b.config);
  for (const char* field : {"rank", "device"}) {  // rank-local (cli/run.cpp compares the ranks without them)
    ca.erase(field);
    cb.erase(field);
  }
  return ca == cb;
}

// ---- how each rank's trace ended ----

RankEnd rank_end_of(const trace::TraceReader& reader, int rank) {
  RankEnd end;
  end.rank = rank;
  end.complete = reader.complete();
  if (!end.complete) {
    const trace::WriterState state = trace::writer_state(reader.path());
    end.writing = state.writing;
    end.terminated = state.terminated;
  }
  end.last_step = reader.last_flushed_step();
  return end;
}

RankEnds rank_ends(std::vector<RankEnd> ranks) {
  RankEnds e;
  std::sort(ranks.begin(), ranks.end(), [](const RankEnd& a, const RankEnd& b) { return a.rank < b.rank; });
  e.ranks = std::move(ranks);
  const auto last = [](const RankEnd& r) { return r.last_step.value_or(-1); };
  std::int64_t latest = -1;
  for (const RankEnd& r : e.ranks) {
    latest = std::max(latest, last(r));
    if (r.stopped()) e.stopped.push_back(r.rank);
  }
  if (e.stopped.empty()) return e;
  // Fewer durable steps than another rank: it stopped first (the ranks step together: a rank cannot run
  // more than a step ahead of another, whose gradients it waits for).
  for (const RankEnd& r : e.ranks)
    if (r.stopped() && last(r) < latest) e.ended_early.push_back(r.rank);
  if (e.ended_early.empty()) {
    // All at one step: a rank whose writer died without notice, while another's was closed, still writes,
    // or was asked to stop (SIGTERM: mpirun's, after a rank died).
    const bool others_told = std::any_of(e.ranks.begin(), e.ranks.end(), [](const RankEnd& r) {
      return r.complete || r.writing || r.terminated;
    });
    if (others_told)
      for (const RankEnd& r : e.ranks)
        if (r.stopped() && !r.terminated) e.ended_early.push_back(r.rank);
  }
  e.together = e.ended_early.empty();
  return e;
}

namespace {

// Where a trace stops: "at step 12" (its last durable step), or "before its first step" when none was durable.
std::string step_of(const RankEnd& r) {
  return r.last_step ? fmt::format("at step {}", *r.last_step) : std::string("before its first step");
}

std::string rank_list(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

}  // namespace

std::string render_text(const RankEnds& e) {
  if (e.finished()) return {};
  std::string t;
  const auto& by_rank = e.ranks;
  const auto find = [&](int rank) -> const RankEnd& {
    return *std::find_if(by_rank.begin(), by_rank.end(), [&](const RankEnd& r) { return r.rank == rank; });
  };
  // The rank whose trace goes furthest, for the comparison.
  const RankEnd* furthest = nullptr;
  for (const RankEnd& r : by_rank)
    if (furthest == nullptr || r.last_step.value_or(-1) > furthest->last_step.value_or(-1)) furthest = &r;
  if (e.together) {
    const RankEnd& any = find(e.stopped.front());
    const bool all_terminated = std::all_of(e.stopped.begin(), e.stopped.end(), [&](int r) { return find(r).terminated; });
    if (all_terminated) {
      t += fmt::format("the run did not finish: {} {} ended by SIGTERM {}, without closing {} trace\n",
                       rank_list(e.stopped), e.stopped.size() == 1 ? "was" : "were", step_of(any),
                       e.stopped.size() == 1 ? "its" : "their");
    } else {
      t += fmt::format("the run did not finish: the trace{} of {} {} {} without being closed by {} writer{}, and no "
                       "termination request reached {}: the job was killed (the traces cannot tell which rank went "
                       "first)\n",
                       e.stopped.size() == 1 ? "" : "s", rank_list(e.stopped), e.stopped.size() == 1 ? "stops" : "stop",
                       step_of(any), e.stopped.size() == 1 ? "its" : "their", e.stopped.size() == 1 ? "" : "s",
                       e.stopped.size() == 1 ? "it" : "them");
    }
    return t;
  }
  for (int rank : e.ended_early) {
    const RankEnd& r = find(rank);
    std::string ahead;
    if (r.last_step.value_or(-1) < furthest->last_step.value_or(-1))
      ahead = fmt::format(", while rank {}'s goes on to step {}", furthest->rank, *furthest->last_step);
    t += fmt::format("rank {} ENDED EARLY: its trace stops {} without being closed by its writer{}; {}\n", rank,
                     step_of(r), ahead,
                     r.terminated ? "its process was ended by SIGTERM"
                                  : "no termination request reached it: the rank died there (SIGKILL, a crash, the "
                                    "out-of-memory killer)");
  }
  std::vector<int> after, silent;
  for (int rank : e.stopped) {
    if (std::find(e.ended_early.begin(), e.ended_early.end(), rank) != e.ended_early.end()) continue;
    (find(rank).terminated ? after : silent).push_back(rank);
  }
  if (!after.empty())
    t += fmt::format("{} {} then ended by SIGTERM (mpirun ends the other ranks when one dies)\n", rank_list(after),
                     after.size() == 1 ? "was" : "were");
  if (!silent.empty())
    t += fmt::format("{} stopped too, without closing {} trace{}\n", rank_list(silent), silent.size() == 1 ? "its" : "their",
                     silent.size() == 1 ? "" : "s");
  return t;
}

std::string end_status(const RankEnds& e, int rank) {
  for (const RankEnd& r : e.ranks) {
    if (r.rank != rank) continue;
    if (r.complete) return {};
    if (r.writing) return "incomplete: still being written";
    if (std::find(e.ended_early.begin(), e.ended_early.end(), rank) != e.ended_early.end()) return "ENDED EARLY";
    return r.terminated ? "incomplete: ended by SIGTERM" : "incomplete: not closed by its writer";
  }
  return {};
}

// ---- two ranks of one run ----

RankPairCheck check_rank_pair(trace::TraceReader& a, trace::TraceReader& b) {
  if (!same_run(a.run_info(), b.run_info())) {
    throw Error(fmt::format("'{}' and '{}' are not two ranks of one data-parallel run (their configs differ "
                            "beyond rank and device, or one has no rank)",
                            a.path().string(), b.path().string()));
  }
  RankPairCheck check;
  check.a = *rank_place(a.run_info());
  check.b = *rank_place(b.run_info());
  const auto mismatch = [&](RankMismatch m) {
    ++check.mismatch_count;
    if (check.mismatches.size() < kMaxMismatches) check.mismatches.push_back(std::move(m));
  };
  std::map<std::int64_t, trace::StepRow> steps_b;
  for (const trace::StepRow& r : b.steps()) steps_b.emplace(r.step, r);
  std::map<std::int64_t, trace::StepRow> steps_a;
  for (const trace::StepRow& r : a.steps()) steps_a.emplace(r.step, r);
  using GradKey = std::tuple<std::int64_t, std::string, bool>;
  std::map<GradKey, trace::GradRow> grads_a, grads_b;
  for (trace::GradRow& g : a.grads()) grads_a.emplace(GradKey{g.step, g.param, g.unscaled}, std::move(g));
  for (trace::GradRow& g : b.grads()) grads_b.emplace(GradKey{g.step, g.param, g.unscaled}, std::move(g));

  for (const auto& [step, x] : steps_a) {
    const auto found = steps_b.find(step);
    if (found == steps_b.end()) continue;  // one rank's writer stopped earlier (killed): nothing to compare
    const trace::StepRow& y = found->second;
    ++check.steps_compared;
    const auto field = [&](const char* what, double u, double v) {
      if (!same(u, v)) mismatch({step, what, "", exact(u), exact(v)});
    };
    field("scale", x.scale, y.scale);
    field("scale_after", x.scale_after, y.scale_after);
    if (x.skipped != y.skipped) mismatch({step, "skipped", "", x.skipped ? "true" : "false", y.skipped ? "true" : "false"});
    if (x.found_inf != y.found_inf)
      mismatch({step, "found_inf", "", x.found_inf ? "true" : "false", y.found_inf ? "true" : "false"});
    if (x.growth_tracker != y.growth_tracker)
      mismatch({step, "growth_tracker", "", std::to_string(x.growth_tracker), std::to_string(y.growth_tracker)});
    field("grad_norm", x.grad_norm, y.grad_norm);
    field("lr", x.lr, y.lr);
    // The gradients after the all-reduce: every rank received the same bits.
    const auto first = grads_a.lower_bound(GradKey{step, "", false});
    for (auto it = first; it != grads_a.end() && std::get<0>(it->first) == step; ++it) {
      const trace::GradRow& g = it->second;
      const auto other = grads_b.find(it->first);
      if (other == grads_b.end()) {
        mismatch({step, "gradient in one rank only", g.param, "recorded", "not recorded"});
        continue;
      }
      const trace::GradRow& h = other->second;
      ++check.grads_compared;
      if (g.dtype != h.dtype) {
        mismatch({step, "gradient", g.param, "dtype " + g.dtype, "dtype " + h.dtype});
      } else if (g.nan != h.nan || g.pos_inf != h.pos_inf || g.neg_inf != h.neg_inf || g.zero != h.zero) {
        mismatch({step, "gradient", g.param, counts_text(g), counts_text(h)});
      } else if (!same(g.norm, h.norm) || !same(g.absmax, h.absmax)) {
        mismatch({step, "gradient", g.param, fmt::format("norm {}, absmax {}", exact(g.norm), exact(g.absmax)),
                  fmt::format("norm {}, absmax {}", exact(h.norm), exact(h.absmax))});
      }
    }
    const auto first_b = grads_b.lower_bound(GradKey{step, "", false});
    for (auto it = first_b; it != grads_b.end() && std::get<0>(it->first) == step; ++it)
      if (!grads_a.count(it->first)) mismatch({step, "gradient in one rank only", it->second.param, "not recorded", "recorded"});
  }
  return check;
}

std::string render_text(const RankPairCheck& c, const TextStyle& style) {
  const auto paint = [&](const char* code, const std::string& s) {
    return style.colour ? fmt::format("\x1b[{}m{}\x1b[0m", code, s) : s;
  };
  std::string t;
  t += fmt::format("{} a is rank {} and b rank {} of one {}-rank data-parallel run. Each rank trains on its own share of "
                   "the global batch, so their forward values, losses and backward values before the all-reduce differ "
                   "by design: the op-by-op comparison below shows the shares' differences, not a fault (a NaN/inf in one "
                   "rank's ops only is that rank's data; `ampscope report` names the rank).\n",
                   paint("1;33", "RANKS OF ONE RUN:"), c.a.rank, c.b.rank, c.a.world_size);
  if (c.agree()) {
    t += fmt::format("{} identical on both ranks, bit for bit: {} steps' loss scale, skip, found_inf and gradient norm, and "
                     "{} gradients after the all-reduce\n",
                     paint("32", "AFTER THE ALL-REDUCE:"), c.steps_compared, c.grads_compared);
  } else {
    t += fmt::format("{} {} differences in what must be identical on every rank (the gradients after the all-reduce, the "
                     "GradScaler's one decision): the ranks trained different models from there\n",
                     paint("31", "RANKS DISAGREE:"), c.mismatch_count);
    for (const RankMismatch& m : c.mismatches) {
      t += fmt::format("  step {}, {}{}: a {}, b {}\n", m.step, m.what, m.param.empty() ? "" : " " + m.param, m.value_a,
                       m.value_b);
    }
    if (c.mismatch_count > static_cast<std::int64_t>(c.mismatches.size()))
      t += fmt::format("  ... and {} more\n", c.mismatch_count - static_cast<std::int64_t>(c.mismatches.size()));
  }
  return t;
}

std::string render_json_object(const RankPairCheck& c) {
  ordered_json j;
  j["rank_a"] = c.a.rank;
  j["rank_b"] = c.b.rank;
  j["world_size"] = c.a.world_size;
  j["steps_compared"] = c.steps_compared;
  j["grads_compared"] = c.grads_compared;
  j["agree"] = c.agree();
  j["mismatch_count"] = c.mismatch_count;
  j["mismatches"] = ordered_json::array();
  for (const RankMismatch& m : c.mismatches)
    j["mismatches"].push_back({{"step", m.step}, {"what", m.what}, {"param", m.param}, {"a", m.value_a}, {"b", m.value_b}});
  return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

// ---- two runs of N ranks each ----

std::optional<RankDivergence> first_divergence_of(const DiffReport& d, int rank) {
  std::vector<RankDivergence> found;
  if (d.first_divergence) {
    const OpDiff& o = *d.first_divergence;
    RankDivergence r{.rank = rank, .step = o.key.step, .step_b = o.step_b, .kind = "op", .phase = o.key.phase,
                     .seq = o.seq_a, .module = o.key.module, .op = o.key.op, .stat = o.stat};
    if (o.nonfinite_differs || o.stat == "nonfinite")
      r.detail = fmt::format("NaN/inf counts differ: a {}, b {}", nonfinite_text(o.a.nan, o.a.pos_inf, o.a.neg_inf),
                             nonfinite_text(o.b.nan, o.b.pos_inf, o.b.neg_inf));
    else
      r.detail = fmt::format("{} differs by {} of the op's largest rms so far (rms a {}, b {})", o.stat, num(o.max_rel),
                             num(o.a.rms), num(o.b.rms));
    found.push_back(std::move(r));
  }
  if (d.first_loss_divergence) {
    RankDivergence r{.rank = rank, .step = *d.first_loss_divergence, .step_b = *d.first_loss_divergence, .kind = "loss"};
    for (const LossPoint& p : d.losses) {
      if (p.step != r.step) continue;
      r.step_b = p.step_b;
      r.detail = fmt::format("a {}, b {} (difference {} of the largest loss so far)", num(p.loss_a), num(p.loss_b), num(p.rel));
    }
    found.push_back(std::move(r));
  }
  if (d.first_grad_divergence) {
    const GradDiff& g = *d.first_grad_divergence;
    RankDivergence r{.rank = rank, .step = g.step, .step_b = g.step_b, .kind = "gradient", .param = g.param, .stat = g.stat};
    if (g.nonfinite_differs)
      r.detail = fmt::format("NaN/inf counts differ: a {}, b {}", nonfinite_text(g.a.nan, g.a.pos_inf, g.a.neg_inf),
                             nonfinite_text(g.b.nan, g.b.pos_inf, g.b.neg_inf));
    else
      r.detail = fmt::format("norm a {}, b {} (difference {} of its largest norm so far)", num(g.a.norm), num(g.b.norm),
                             num(g.rel_norm));
    found.push_back(std::move(r));
  }
  if (found.empty()) return std::nullopt;
  return *std::min_element(found.begin(), found.end(),
                           [](const RankDivergence& x, const RankDivergence& y) { return order_key(x) < order_key(y); });
}

RankDiffReport diff_ranks(const std::vector<std::string>& paths_a, const std::vector<std::string>& paths_b,
                          const DiffOptions& options) {
  if (paths_a.size() != paths_b.size()) {
    throw Error(fmt::format("run a has {} ranks ({}) and run b {} ({}): rank r is compared with rank r, so both "
                            "runs must have the same number of ranks\nhint: to compare one rank's trace with another "
                            "trace, copy it to a name without .rankN (each NAME.rankN.h5 stands for its whole run)",
                            paths_a.size(), fmt::join(paths_a, ", "), paths_b.size(), fmt::join(paths_b, ", ")));
  }
  RankDiffReport report;
  report.paths_a = by_rank(paths_a, "a");
  report.paths_b = by_rank(paths_b, "b");
  report.ranks = static_cast<int>(report.paths_a.size());
  for (int r = 0; r < report.ranks; ++r) {
    trace::TraceReader a(report.paths_a[static_cast<std::size_t>(r)]), b(report.paths_b[static_cast<std::size_t>(r)]);
    for (const trace::TraceReader* t : {&a, &b}) {
      if (!t->complete()) report.incomplete.push_back(t->path().string());
    }
    DiffReport d = diff(a, b, options);
    d.path_a = report.paths_a[static_cast<std::size_t>(r)];
    d.path_b = report.paths_b[static_cast<std::size_t>(r)];
    report.firsts.push_back(first_divergence_of(d, r));
    const std::optional<RankDivergence>& f = report.firsts.back();
    if (f && (!report.first || order_key(*f) < order_key(*report.first))) report.first = f;  // a tie keeps the lower rank
    report.diffs.push_back(std::move(d));
  }
  return report;
}

std::string render_text(const RankDiffReport& d, const TextStyle& style) {
  const auto paint = [&](const char* code, const std::string& s) {
    return style.colour ? fmt::format("\x1b[{}m{}\x1b[0m", code, s) : s;
  };
  std::string t = fmt::format("{} {} ranks each; rank r of a is compared with rank r of b\n",
                              paint("1", "DATA-PARALLEL RUNS:"), d.ranks);
  if (d.first) {
    const RankDivergence& f = *d.first;
    t += fmt::format("{} rank {}, {}, {}: {}\n", paint("31", "FIRST DIVERGENCE ACROSS RANKS:"), f.rank, step_text(f),
                     place_of(f), f.detail);
  } else {
    t += fmt::format("{} no rank's diff parts beyond the threshold {}\n", paint("32", "NO DIVERGENCE ON ANY RANK:"),
                     num(d.diffs.empty() ? DiffOptions{}.threshold : d.diffs.front().options.threshold));
  }
  for (int r = 0; r < d.ranks; ++r) {
    const std::optional<RankDivergence>& f = d.firsts[static_cast<std::size_t>(r)];
    t += f ? fmt::format("  rank {}: parts at {}, {} ({})\n", r, step_text(*f), place_of(*f), f->stat.empty() ? f->kind : f->stat)
           : fmt::format("  rank {}: no divergence\n", r);
  }
  t += "  (a rank's ops and loss are its own share of the global batch; the gradients are those after the all-reduce, "
       "the same on every rank of a run)\n";
  for (int r = 0; r < d.ranks; ++r) {
    t += fmt::format("\n== rank {}: a {}, b {} ==\n", r, d.paths_a[static_cast<std::size_t>(r)],
                     d.paths_b[static_cast<std::size_t>(r)]);
    t += render_text(d.diffs[static_cast<std::size_t>(r)], style);
  }
  return t;
}

std::string render_json(const RankDiffReport& d) {
  ordered_json doc;
  doc["schema_version"] = kReportSchemaVersion;
  doc["kind"] = "diff_ranks";
  doc["ranks"] = d.ranks;
  doc["paths_a"] = d.paths_a;
  doc["paths_b"] = d.paths_b;
  doc["diverged"] = d.diverged();
  doc["incomplete"] = d.incomplete;
  doc["first_divergence"] = divergence_json(d.first);
  doc["rank_divergences"] = ordered_json::array();
  for (const auto& f : d.firsts) doc["rank_divergences"].push_back(divergence_json(f));
  doc["diffs"] = ordered_json::array();
  for (const DiffReport& r : d.diffs) doc["diffs"].push_back(ordered_json::parse(render_json(r)));
  return doc.dump(2, ' ', false, ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace ampscope::analysis
