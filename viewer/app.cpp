// ampscope-view's program: documents and selection, the layout of the frame, the GLFW window and its
// frame loop, and the headless screenshot.
#include <algorithm>
#include <chrono>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <GLFW/glfw3.h>
#include <fmt/format.h>
#include <imgui.h>
#include <backends/imgui_impl_glfw.h>
#include <backends/imgui_impl_opengl3.h>
#include <stb_image_write.h>

#include "viewer/app.h"
#include "probes/analysis/ranks.h"

namespace ampscope::viewer {
namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// The selection without marking it the user's own choice.
void set_selection(ViewerState& s, std::int64_t step, std::optional<std::int64_t> seq) {
  if (!s.a) return;
  s.a->select_step(step);
  if (s.b) s.b->select_step(paired_step_b(s.comparison ? s.comparison->report() : nullptr, step));
  s.selected_seq = seq;
  s.scroll_to_selected = seq.has_value();
}

// Where the first anomaly is, to show it when the analysis ends. --seq without --step picks the op in
// that step. The early anomaly shown until then gives way: to the analysis's first anomaly, or, when the
// analysis finds none, to the first step (what the viewer shows without it), with a note saying why.
void select_first_anomaly(ViewerState& s) {
  const analysis::Report* rep = s.a->report();
  const bool early = s.early_shown && s.a->early_anomaly();
  s.early_shown = false;
  if (rep && !rep->anomalies.empty()) {
    const auto& d = rep->anomalies.front();
    set_selection(s, d.step, s.wanted_seq ? s.wanted_seq : d.seq >= 0 ? std::optional<std::int64_t>(d.seq) : std::nullopt);
  } else if (!s.a->selected_step() || early) {
    if (auto first = initial_step(s.a->steps(), rep)) set_selection(s, *first, s.wanted_seq);
  }
  if (early && rep) s.anomaly_note = early_anomaly_verdict(*s.a->early_anomaly(), *rep, s.a->selected_step());
}

// The early anomaly's step is read: select its op (the event's, else the step's origin), or none when its rows
// do not hold the op the event named.
void pick_early_op(ViewerState& s) {
  const StepData* d = s.a->step_data();
  if (!s.early_shown || s.user_selected || s.wanted_seq || !d || d->load_id == s.early_op_for) return;
  s.early_op_for = d->load_id;
  if (d->step != s.a->early_anomaly()->step) return;
  s.selected_seq = early_anomaly_op(d->ops, s.a->early_anomaly()->seq);
  s.scroll_to_selected = s.selected_seq.has_value();
}

std::string glfw_error_text;
void glfw_error(int code, const char* text) { glfw_error_text = fmt::format("GLFW error {}: {}", code, text ? text : "?"); }

void drop_callback(GLFWwindow* window, int count, const char** paths) {
  auto* s = static_cast<ViewerState*>(glfwGetWindowUserPointer(window));
  for (int i = 0; i < count; ++i) s->dropped.emplace_back(paths[i]);
}

float errors_height(const ViewerState& s, float width) {
  if (s.errors.empty()) return 0;
  float h = 50;  // title bar, dismiss button, padding
  for (const auto& e : s.errors) h += ImGui::CalcTextSize(e.c_str(), nullptr, false, width - 40).y + 20;
  return h;
}

bool write_png(const std::string& path, int w, int h) {
  std::vector<unsigned char> pixels(static_cast<std::size_t>(w) * h * 3);
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  glReadBuffer(GL_BACK);
  glReadPixels(0, 0, w, h, GL_RGB, GL_UNSIGNED_BYTE, pixels.data());
  // OpenGL's rows start at the bottom; PNG's at the top.
  std::vector<unsigned char> flipped(pixels.size());
  const std::size_t row = static_cast<std::size_t>(w) * 3;
  for (int y = 0; y < h; ++y) {
    std::copy_n(pixels.data() + static_cast<std::size_t>(h - 1 - y) * row, row, flipped.data() + static_cast<std::size_t>(y) * row);
  }
  return stbi_write_png(path.c_str(), w, h, 3, flipped.data(), static_cast<int>(row)) != 0;
}

}  // namespace

namespace {

// `doc` becomes trace a, in place of the one shown (and of an open rank set): selection and plots afresh.
void adopt_a(ViewerState& s, std::unique_ptr<TraceDocument> doc) {
  s.a = std::move(doc);
  s.ranks.clear();
  s.rank_shown = 0;
  s.rank_lines.clear();
  s.rank_lines_steps.clear();
  s.selected_seq.reset();
  s.user_selected = false;
  s.jumped_to_anomaly = false;
  s.early_shown = false;
  s.early_op_for = 0;
  s.anomaly_note.clear();
  s.op_rows_for = 0;
  s.op_rows_dirty = true;
  s.series_steps = static_cast<std::size_t>(-1);
  // A new trace is fitted afresh, whatever the user had zoomed in the last one.
  s.shared_x = {};
  s.scale_plot = s.loss_plot = s.norm_plot = {};
  s.fp8_row.reset();
  s.fp8_plot_for.reset();
  s.fp8_plot = {};
  s.blocks_row.reset();
  s.histogram_plot = {};
  s.histogram_special = {};
  s.compare_plot = {};
}

void restart_comparison(ViewerState& s) {
  s.comparison.reset();
  s.op_diffs.clear();
  s.op_diffs_for_a = s.op_diffs_for_b = 0;
  if (s.a && s.b) s.comparison = std::make_unique<Comparison>(s.a->path(), s.b->path());
}

}  // namespace

void open_trace(ViewerState& s, const std::filesystem::path& path, bool as_b) {
  TraceDocument::Options options;
  options.read_early_step = !as_b && !s.wanted_step;  // b shows a's step; --step another
  auto doc = TraceDocument::open(path, options);
  if (!doc->ok()) {
    s.errors.push_back(fmt::format("cannot open {}:\n{}", path.string(), doc->error()));
    return;
  }
  if (as_b && s.a) {
    s.b = std::move(doc);
    s.show_compare = true;
    if (auto step = s.a->selected_step()) s.b->select_step(*step);
  } else {
    adopt_a(s, std::move(doc));
  }
  restart_comparison(s);
}

void open_paths(ViewerState& s, const std::vector<std::string>& names) {
  const OpenPlan plan = open_plan(names);
  if (!plan.ranks.empty()) {
    open_ranks(s, plan.ranks, plan.shown);
    return;
  }
  if (!plan.a.empty()) open_trace(s, plan.a, false);
  if (!plan.b.empty()) open_trace(s, plan.b, true);
}

void open_ranks(ViewerState& s, const std::vector<std::string>& paths, std::size_t shown) {
  struct Opened {
    int rank = 0;
    std::unique_ptr<TraceDocument> doc;
    bool shown = false;
  };
  std::vector<Opened> opened;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    TraceDocument::Options options;
    options.analyse = false;  // the shown rank's analysis starts below; the others' when first shown
    auto doc = TraceDocument::open(paths[i], options);
    if (!doc->ok()) {
      s.errors.push_back(fmt::format("cannot open {}:\n{}", paths[i], doc->error()));
      continue;
    }
    opened.push_back({0, std::move(doc), i == shown});
  }
  if (opened.empty()) return;
  // Every trace a rank of the first one's run, each rank once.
  std::string problem;
  const trace::RunInfo& first = opened.front().doc->run_info();
  for (Opened& o : opened) {
    const std::optional<analysis::RankPlace> place = analysis::rank_place(o.doc->run_info());
    if (!place) {
      problem = fmt::format("{} is not a trace of a data-parallel run (its config has no rank and world_size)",
                            o.doc->path().string());
      break;
    }
    if (!analysis::same_run(first, o.doc->run_info())) {
      problem = fmt::format("{} is not a rank of the same run as {} (their configs differ beyond rank and device)",
                            o.doc->path().string(), opened.front().doc->path().string());
      break;
    }
    o.rank = place->rank;
    for (const Opened& p : opened) {
      if (&p == &o) break;
      if (p.rank == o.rank) problem = fmt::format("{} and {} are both rank {}", p.doc->path().string(), o.doc->path().string(), o.rank);
    }
    if (!problem.empty()) break;
  }
  if (!problem.empty() || opened.size() < 2) {
    if (!problem.empty())
      s.errors.push_back(fmt::format("cannot open the traces as one data-parallel run's ranks: {}; showing {} alone",
                                     problem, opened.front().doc->path().string()));
    opened.front().doc->enable_analysis();
    adopt_a(s, std::move(opened.front().doc));
    s.b.reset();
    restart_comparison(s);
    return;
  }
  std::stable_sort(opened.begin(), opened.end(), [](const Opened& x, const Opened& y) { return x.rank < y.rank; });
  std::size_t show = 0;
  for (std::size_t i = 0; i < opened.size(); ++i)
    if (opened[i].shown) show = i;
  opened[show].doc->enable_analysis();
  adopt_a(s, std::move(opened[show].doc));
  for (Opened& o : opened) s.ranks.push_back({o.rank, std::move(o.doc)});  // the shown one's slot is empty
  s.rank_shown = show;
  s.b.reset();
  restart_comparison(s);
}

bool select_rank(ViewerState& s, int rank) {
  std::size_t index = s.ranks.size();
  for (std::size_t i = 0; i < s.ranks.size(); ++i)
    if (s.ranks[i].rank == rank) index = i;
  if (index == s.ranks.size() || !s.a) return false;
  if (index == s.rank_shown) return true;
  const std::optional<std::int64_t> step = s.a->selected_step();
  s.ranks[s.rank_shown].doc = std::move(s.a);
  s.a = std::move(s.ranks[index].doc);
  s.rank_shown = index;
  s.a->enable_analysis();
  // The same step and op on the other rank (the ranks run the same ops); until the user picks a step, the
  // selection follows this rank's first anomaly once its analysis is in.
  if (step) s.a->select_step(*step);
  s.jumped_to_anomaly = false;
  s.early_shown = false;  // this rank's selection is the step kept, not its early anomaly
  s.anomaly_note.clear();
  s.op_rows_for = 0;
  s.op_rows_dirty = true;
  s.series_steps = static_cast<std::size_t>(-1);  // the markers are the shown rank's
  s.histogram_seq.reset();
  s.detail_links_seq.reset();
  s.error_plot_for.reset();
  s.scroll_to_selected = s.selected_seq.has_value();
  if (s.b) restart_comparison(s);
  return true;
}

const TraceDocument* rank_document(const ViewerState& s, std::size_t i) {
  if (i >= s.ranks.size()) return nullptr;
  return i == s.rank_shown ? s.a.get() : s.ranks[i].doc.get();
}

void select_step(ViewerState& s, std::int64_t step, std::optional<std::int64_t> seq) {
  s.user_selected = true;
  s.early_shown = false;  // the user's step, not the early anomaly: no provisional label on it
  s.anomaly_note.clear();
  set_selection(s, step, seq);
}

void select_op(ViewerState& s, std::int64_t seq) {
  s.user_selected = true;  // the user's choice: the jump to the first anomaly must not undo it
  s.selected_seq = seq;
  s.scroll_to_selected = true;
}

void poll_documents(ViewerState& s) {
  if (!s.dropped.empty()) {
    std::vector<std::string> files;
    files.swap(s.dropped);
    if (files.size() == 1 && s.compare_hovered && s.a != nullptr) {
      open_trace(s, files[0], true);
    } else {
      open_paths(s, files);  // two files: a and b, unless they are ranks of one run
    }
  }
  if (s.a) s.a->poll();
  for (ViewerState::RankSlot& r : s.ranks)
    if (r.doc) r.doc->poll();  // the ranks not shown: a live run's steps grow in the overlays
  if (s.b) s.b->poll();
  if (s.comparison && s.comparison->poll() && s.a && s.b && s.a->selected_step()) {
    // The diff is in: when it paired the runs by optimizer update, b's step beside a's is another one.
    s.b->select_step(paired_step_b(s.comparison->report(), *s.a->selected_step()));
  }
  if (!s.a) return;
  if (!s.a->selected_step()) {
    if (s.wanted_step) {
      set_selection(s, *s.wanted_step, s.wanted_seq);
      s.user_selected = true;
    } else if (s.a->report()) {
      select_first_anomaly(s);
      s.jumped_to_anomaly = true;
    } else if (const auto& early = s.a->early_anomaly()) {
      // The trace's own tables name the first anomaly: show it, provisional, while the analysis runs (unconfirmed
      // when it failed or has not started).
      set_selection(s, early->step, s.wanted_seq ? s.wanted_seq : early->seq);
      s.early_shown = true;
    } else if (!s.a->analysing()) {
      select_first_anomaly(s);
      s.jumped_to_anomaly = true;
    } else if (!s.headless) {
      // Show the first step while the analysis runs; jump to the anomaly when it ends.
      if (auto first = initial_step(s.a->steps(), nullptr)) set_selection(s, *first, std::nullopt);
    }
  }
  if (s.a->report() && !s.user_selected && !s.jumped_to_anomaly) {
    select_first_anomaly(s);
    s.jumped_to_anomaly = true;
  }
  // The analysis ended after the user picked an op of the early anomaly's step: the label goes.
  if (s.a->report()) s.early_shown = false;
  pick_early_op(s);
}

bool fp8_panel_wanted(const ViewerState& s) {
  if (!s.a || !s.a->ok() || !has_fp8_panel(s.a->counts())) return false;
  return s.panel == "fp8" || (s.panel == "all" && s.show_fp8);
}

void select_fp8_cell(ViewerState& s, std::size_t row, std::int64_t step) {
  const Fp8Map* m = s.a ? s.a->fp8() : nullptr;
  if (!m || row >= m->rows.size()) return;
  s.fp8_row = row;
  const std::string& module = m->rows[row].module;
  std::snprintf(s.filter_text, sizeof s.filter_text, "%s", module.c_str());
  s.filter.text = s.filter_text;
  s.op_rows_dirty = true;
  select_step(s, step);
}

bool blocks_panel_wanted(const ViewerState& s) {
  if (!s.a || !s.a->ok() || !has_blocks_panel(s.a->counts())) return false;
  return s.panel == "blocks" || (s.panel == "all" && s.show_blocks);
}

void select_block_cell(ViewerState& s, std::size_t row, std::int64_t step) {
  const BlockMap* m = s.a ? s.a->blocks() : nullptr;
  if (!m || row >= m->rows.size()) return;
  s.blocks_row = row;
  std::snprintf(s.filter_text, sizeof s.filter_text, "%s", m->rows[row].module.c_str());
  s.filter.text = s.filter_text;
  s.op_rows_dirty = true;
  select_step(s, step);
}

bool idle(const ViewerState& s) {
  auto doc_idle = [](const TraceDocument* d) {
    return !d || (!d->analysing() && !d->precision_loading() && !d->fp8_loading() && !d->blocks_loading() &&
                  !d->step_loading());
  };
  return doc_idle(s.a.get()) && doc_idle(s.b.get()) && (!s.comparison || !s.comparison->running()) &&
         (!s.a || s.a->selected_step() || s.a->steps().empty());
}

void draw_frame(ViewerState& s) {
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  Layout& l = s.layout;
  l = Layout{};
  if (s.panel == "all") draw_menu_bar(s);
  const float x0 = vp->WorkPos.x, W = vp->WorkSize.x;
  float y0 = vp->WorkPos.y, H = vp->WorkSize.y;
  if (!s.errors.empty()) {
    const float eh = std::min(errors_height(s, W), H * 0.5f);
    l.errors = {x0, y0, W, eh, true};
    y0 += eh;
    H -= eh;
  }
  if (s.panel == "all") {
    const float left_w = std::floor(W * 0.34f), right_w = W - left_w;
    const float overview_h = std::floor(H * 0.42f);
    l.overview = {x0, y0, left_w, overview_h, true};
    l.why = {x0, y0 + overview_h, left_w, H - overview_h, true};
    const float scale_h = std::floor(H * 0.5f);
    (blocks_panel_wanted(s) ? l.blocks : fp8_panel_wanted(s) ? l.fp8 : s.show_precision ? l.precision : l.scale) = {
        x0 + left_w, y0, right_w, scale_h, true};
    const float bottom_y = y0 + scale_h, bottom_h = H - scale_h;
    const float ops_w = std::floor(right_w * (s.show_compare ? 0.45f : 0.6f));
    l.ops = {x0 + left_w, bottom_y, ops_w, bottom_h, true};
    PanelRect& other = s.show_compare ? l.compare : l.detail;
    other = {x0 + left_w + ops_w, bottom_y, right_w - ops_w, bottom_h, true};
  } else {
    const PanelRect full{x0, y0, W, H, true};
    if (s.panel == "overview") l.overview = full;
    if (s.panel == "scale") l.scale = full;
    if (s.panel == "ops") l.ops = full;
    if (s.panel == "detail") l.detail = full;
    if (s.panel == "why") l.why = full;
    if (s.panel == "compare") l.compare = full;
    if (s.panel == "fp8" && fp8_panel_wanted(s)) l.fp8 = full;
    if (s.panel == "blocks" && blocks_panel_wanted(s)) l.blocks = full;
    if (s.panel == "precision") {
      // The heatmap above the Op detail its clicks fill.
      const float heat_h = std::floor(H * 0.55f);
      l.precision = {x0, y0, W, heat_h, true};
      l.detail = {x0, y0 + heat_h, W, H - heat_h, true};
    }
  }
  s.compare_hovered = false;
  draw_errors(s);
  draw_overview_panel(s);
  draw_why_panel(s);
  draw_scale_panel(s);
  draw_ops_panel(s);
  draw_detail_panel(s);
  draw_compare_panel(s);
  draw_precision_panel(s);
  draw_fp8_panel(s);
  draw_blocks_panel(s);
  draw_file_browser(s);
}

int run_viewer(const ViewerOptions& o) {
  const auto t_start = Clock::now();
  const bool headless = !o.screenshot.empty() || o.scroll_frames > 0;
  glfwSetErrorCallback(glfw_error);
  if (!glfwInit()) {
    std::fprintf(stderr,
                 "ampscope-view: cannot open a window: there is no display (%s).\n"
                 "hint: run it on a desktop, set DISPLAY, or run it under Xvfb: xvfb-run -a ampscope-view ...\n",
                 glfw_error_text.c_str());
    return 2;
  }
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 3);
  glfwWindowHint(GLFW_OPENGL_PROFILE, GLFW_OPENGL_CORE_PROFILE);
  glfwWindowHint(GLFW_OPENGL_FORWARD_COMPAT, GLFW_TRUE);
  if (headless) glfwWindowHint(GLFW_RESIZABLE, GLFW_FALSE);
  GLFWwindow* window = glfwCreateWindow(o.width, o.height, "ampscope-view", nullptr, nullptr);
  if (!window) {
    std::fprintf(stderr, "ampscope-view: cannot create an OpenGL 3.3 window (%s).\n"
                         "hint: under Xvfb, Mesa's llvmpipe provides it (Debian: libgl1-mesa-dri)\n",
                 glfw_error_text.c_str());
    glfwTerminate();
    return 2;
  }
  glfwMakeContextCurrent(window);
  glfwSwapInterval(headless ? 0 : 1);

  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  ImGuiIO& io = ImGui::GetIO();
  io.IniFilename = nullptr;  // the layout is fixed: nothing to remember between runs
  ImGui::StyleColorsDark();
  ImGui_ImplGlfw_InitForOpenGL(window, true);
  ImGui_ImplOpenGL3_Init("#version 330");

  ViewerState s;
  s.panel = o.panel;
  s.headless = headless;
  s.wanted_step = o.step;
  s.wanted_seq = o.seq;
  s.show_compare = o.panel == "compare";
  glfwSetWindowUserPointer(window, &s);
  glfwSetDropCallback(window, drop_callback);
  open_paths(s, o.traces);
  if (o.rank && !select_rank(s, *o.rank)) {
    std::string open;
    for (const ViewerState::RankSlot& r : s.ranks) open += (open.empty() ? "" : ", ") + std::to_string(r.rank);
    s.errors.push_back(open.empty() ? fmt::format("--rank {}: the traces opened are not a data-parallel run's ranks", *o.rank)
                                    : fmt::format("--rank {}: the ranks open are {}", *o.rank, open));
  }
  const auto t_opened = Clock::now();
  if (s.b) s.show_compare = true;

  int status = 0;
  int settled = 0;  // frames drawn since everything was loaded
  bool first_frame_done = false;
  Clock::time_point t_first_frame{}, t_ready{};
  // The first frame drawn with a first anomaly selected and its step's rows in: the trace's early anomaly
  // (provisional) or the analysis's, whichever came first; where it came from.
  std::optional<Clock::time_point> t_anomaly;
  std::int64_t anomaly_step = 0;
  const char* anomaly_from = "";
  int scroll_done = 0;
  std::vector<double> frame_ms, ui_ms;  // whole frames; the UI's own work (events, panels, ImGui) within them
  while (!glfwWindowShouldClose(window)) {
    const auto t_frame = Clock::now();
    if (headless || !idle(s) || (s.a && s.a->live())) {
      glfwPollEvents();
    } else {
      glfwWaitEventsTimeout(0.25);
    }
    poll_documents(s);
    ImGui_ImplOpenGL3_NewFrame();
    ImGui_ImplGlfw_NewFrame();
    // Xvfb's pointer rests mid-screen: keep it from hovering (and highlighting) anything in a screenshot.
    if (headless) io.MousePos = ImVec2(-FLT_MAX, -FLT_MAX);
    ImGui::NewFrame();
    draw_frame(s);
    ImGui::Render();
    const auto t_built = Clock::now();
    int fw = 0, fh = 0;
    glfwGetFramebufferSize(window, &fw, &fh);
    glViewport(0, 0, fw, fh);
    glClearColor(0.08f, 0.08f, 0.09f, 1.0f);
    glClear(GL_COLOR_BUFFER_BIT);
    ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());

    const bool ready = idle(s);
    if (ready) ++settled;
    // A few frames after loading, so auto-sized columns and fitted axes have settled.
    const bool shoot = !o.screenshot.empty() && settled >= 4 && (o.scroll_frames == 0 || scroll_done >= o.scroll_frames);
    if (shoot) {
      if (fw != o.width || fh != o.height) {
        std::fprintf(stderr, "ampscope-view: note: the window is %dx%d, not the %dx%d asked for (the screen is smaller?)\n",
                     fw, fh, o.width, o.height);
      }
      if (!write_png(o.screenshot, fw, fh)) {
        std::fprintf(stderr, "ampscope-view: cannot write %s\n", o.screenshot.c_str());
        status = 1;
      }
    }
    glfwSwapBuffers(window);
    if (o.timings || o.scroll_frames > 0) glFinish();
    const auto t_end = Clock::now();
    if (!first_frame_done) {
      first_frame_done = true;
      t_first_frame = t_end;
    }
    if (ready && settled == 1) t_ready = t_end;
    if (!t_anomaly && s.a && !s.user_selected && s.a->step_data()) {
      const std::int64_t step = s.a->step_data()->step;
      const analysis::Report* rep = s.a->report();
      const auto& early = s.a->early_anomaly();
      if (s.early_shown && early && early->step == step) {
        anomaly_from = early->from_events ? "events" : "steps";
      } else if (rep && !rep->anomalies.empty() && rep->anomalies.front().step == step) {
        anomaly_from = "analysis";
      }
      if (*anomaly_from) {
        t_anomaly = t_end;
        anomaly_step = step;
      }
    }
    if (o.scroll_frames > 0 && settled >= 4) {
      if (scroll_done > 0) {
        frame_ms.push_back(ms_between(t_frame, t_end));
        ui_ms.push_back(ms_between(t_frame, t_built));
      }
      if (scroll_done == 0) s.bench_scroll_pixels = std::max(1.0f, s.op_row_height) * 7.3f;  // rows a frame
      if (scroll_done++ >= o.scroll_frames) break;
    }
    if (shoot) break;
    if (headless && !ready) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (headless && ms_between(t_start, t_end) > 120000) {
      std::fprintf(stderr, "ampscope-view: still loading after 120 s; giving up\n");
      status = 1;
      break;
    }
  }
  if (o.timings) {
    std::printf("open_ms %.1f\nfirst_frame_ms %.1f\n", ms_between(t_start, t_opened), ms_between(t_start, t_first_frame));
    // Not when it never came (a headless run that gave up at 120 s printed a time before the start).
    if (t_ready != Clock::time_point{}) std::printf("ready_ms %.1f\n", ms_between(t_start, t_ready));
    // Time to the first anomaly shown (its step selected and its rows drawn), where it came from and its step;
    // absent when none was shown (no anomaly, or --step / a click chose the step).
    if (t_anomaly) {
      std::printf("first_anomaly_ms %.1f\nfirst_anomaly_from %s\nfirst_anomaly_step %lld\n", ms_between(t_start, *t_anomaly),
                  anomaly_from, static_cast<long long>(anomaly_step));
    }
    if (s.a) {
      // Trace a's own open (reader, /steps, the early anomaly's search): open_ms above also holds the window's creation.
      std::printf("trace_open_ms %.1f\n", s.a->open_ms());
      std::printf("steps %zu\nop_rows %lld\n", s.a->steps().size(), static_cast<long long>(s.a->counts().ops));
      // The step shown at the end (--step's, else the first anomaly's): bench/viewer_bench checks it.
      if (const auto step = s.a->selected_step()) std::printf("selected_step %lld\n", static_cast<long long>(*step));
      if (const StepData* d = s.a->step_data()) std::printf("step_rows %zu\nstep_read_ms %.1f\n", d->ops.size(), d->read_ms);
      // An FP8 run's heatmap (the FP8 panel): its rows read and its cells (operands x steps).
      if (const Fp8Map* m = s.a->fp8()) {
        std::printf("fp8_rows %lld\nfp8_cells %zu\n", static_cast<long long>(s.a->counts().fp8), m->rows.size() * m->steps.size());
      }
      if (const BlockMap* m = s.a->blocks()) {
        std::printf("blocks_rows %lld\nblocks_cells %zu\n", static_cast<long long>(s.a->counts().blocks),
                    m->rows.size() * m->steps.size());
      }
    }
  }
  auto print_stats = [](const char* name, std::vector<double> v) {
    std::sort(v.begin(), v.end());
    double sum = 0;
    for (double x : v) sum += x;
    std::printf("%s_mean_ms %.2f\n%s_p50_ms %.2f\n%s_p95_ms %.2f\n%s_max_ms %.2f\n", name,
                sum / static_cast<double>(v.size()), name, v[v.size() / 2], name,
                v[std::min(v.size() - 1, v.size() * 95 / 100)], name, v.back());
  };
  if (!frame_ms.empty()) {
    std::printf("scroll_frames %zu\n", frame_ms.size());
    print_stats("frame", frame_ms);  // events, panels, rendering by OpenGL (llvmpipe under Xvfb), swap
    print_stats("ui", ui_ms);        // events, panels and ImGui's own work, without the rendering
    std::printf("ops_table_rows %zu\n", s.op_rows.size());
  }
  ImGui_ImplOpenGL3_Shutdown();
  ImGui_ImplGlfw_Shutdown();
  ImGui::DestroyContext();
  glfwDestroyWindow(window);
  glfwTerminate();
  return status;
}

}  // namespace ampscope::viewer
