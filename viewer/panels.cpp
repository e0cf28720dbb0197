// The panels of ampscope-view: one function each, drawing what viewer/view_model.h computes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include <fmt/format.h>
#include <imgui.h>

#include "probes/analysis/precision.h"
#include "viewer/app.h"

namespace ampscope::viewer {
namespace {

constexpr ImGuiWindowFlags kPanelFlags =
    ImGuiWindowFlags_NoMove | ImGuiWindowFlags_NoResize | ImGuiWindowFlags_NoCollapse | ImGuiWindowFlags_NoSavedSettings;

ImVec4 to_vec4(std::uint32_t c) { return ImGui::ColorConvertU32ToFloat4(c); }

// Opens a panel's window at its place in the layout; false when it should not be drawn (End() is called).
bool begin_panel(const char* title, const PanelRect& r) {
  if (!r.visible) return false;
  ImGui::SetNextWindowPos(ImVec2(r.x, r.y), ImGuiCond_Always);
  ImGui::SetNextWindowSize(ImVec2(r.w, r.h), ImGuiCond_Always);
  if (!ImGui::Begin(title, nullptr, kPanelFlags)) {
    ImGui::End();
    return false;
  }
  return true;
}

void help_marker(std::string_view text) {
  ImGui::SameLine();
  ImGui::TextDisabled("(?)");
  if (ImGui::IsItemHovered()) {
    ImGui::BeginTooltip();
    ImGui::PushTextWrapPos(ImGui::GetFontSize() * 30.0f);
    ImGui::TextUnformatted(text.data(), text.data() + text.size());
    ImGui::PopTextWrapPos();
    ImGui::EndTooltip();
  }
}

// A two-column table of key/value lines; alert values in the warning colour.
void key_value_table(const char* id, const std::vector<KeyValue>& rows, float key_width = 120) {
  if (!ImGui::BeginTable(id, 2, ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV)) return;
  ImGui::TableSetupColumn("key", ImGuiTableColumnFlags_WidthFixed, key_width);
  ImGui::TableSetupColumn("value", ImGuiTableColumnFlags_WidthStretch);
  for (const auto& kv : rows) {
    ImGui::TableNextRow();
    ImGui::TableSetColumnIndex(0);
    ImGui::TextDisabled("%s", kv.key.c_str());
    ImGui::TableSetColumnIndex(1);
    if (kv.alert) ImGui::PushStyleColor(ImGuiCol_Text, to_vec4(colours::kWarning));
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextUnformatted(kv.value.c_str());
    ImGui::PopTextWrapPos();
    if (kv.alert) ImGui::PopStyleColor();
  }
  ImGui::EndTable();
}

// A message in the error colours, on a box wide enough to be seen (and found by the screenshot tests).
void error_box(const std::string& text) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 p = ImGui::GetCursorScreenPos();
  const float w = ImGui::GetContentRegionAvail().x;
  const float wrap = w - 12;
  const ImVec2 text_size = ImGui::CalcTextSize(text.c_str(), nullptr, false, wrap);
  const float h = text_size.y + 12;
  dl->AddRectFilled(ImVec2(std::floor(p.x), std::floor(p.y)), ImVec2(std::floor(p.x + w), std::floor(p.y + h)),
                    colours::kErrorBackground);
  ImGui::SetCursorScreenPos(ImVec2(p.x + 6, p.y + 6));
  ImGui::PushStyleColor(ImGuiCol_Text, to_vec4(colours::kErrorText));
  ImGui::PushTextWrapPos(ImGui::GetCursorPos().x + wrap);
  ImGui::TextUnformatted(text.c_str());
  ImGui::PopTextWrapPos();
  ImGui::PopStyleColor();
  ImGui::SetCursorScreenPos(ImVec2(p.x, p.y + h + 4));
  ImGui::Dummy(ImVec2(w, 0));
}

// "No trace open" and friends: true when the panel has a document to draw.
bool need_trace(ViewerState& s) {
  if (s.a) return true;
  ImGui::TextDisabled("No trace open. File > Open, or drop a .h5 file onto the window.");
  return false;
}

const trace::OpRow* selected_op(const ViewerState& s) {
  if (!s.a || !s.selected_seq) return nullptr;
  const StepData* d = s.a->step_data();
  if (!d) return nullptr;
  // Ops come in seq order; a binary search finds the row, a scan covers a trace written otherwise.
  auto it = std::lower_bound(d->ops.begin(), d->ops.end(), *s.selected_seq,
                             [](const trace::OpRow& r, std::int64_t seq) { return r.seq < seq; });
  if (it != d->ops.end() && it->seq == *s.selected_seq) return &*it;
  for (const auto& r : d->ops) {
    if (r.seq == *s.selected_seq) return &r;
  }
  return nullptr;
}

void step_picker(ViewerState& s) {
  if (!s.a || s.a->steps().empty()) return;
  const auto& steps = s.a->steps();
  std::int64_t current = s.a->selected_step().value_or(steps.front().step);
  auto index = step_index(steps, current).value_or(0);
  ImGui::AlignTextToFramePadding();
  ImGui::Text("step");
  ImGui::SameLine();
  if (ImGui::ArrowButton("##prev", ImGuiDir_Left) && index > 0) select_step(s, steps[index - 1].step);
  ImGui::SameLine();
  ImGui::SetNextItemWidth(80);
  long long value = current;
  if (ImGui::InputScalar("##step", ImGuiDataType_S64, &value, nullptr, nullptr, "%lld",
                         ImGuiInputTextFlags_EnterReturnsTrue)) {
    if (auto n = nearest_step(steps, static_cast<double>(value))) select_step(s, *n);
  }
  ImGui::SameLine();
  if (ImGui::ArrowButton("##next", ImGuiDir_Right) && index + 1 < steps.size()) select_step(s, steps[index + 1].step);
  ImGui::SameLine();
  if (auto i = step_index(steps, current)) {
    const auto& r = steps[*i];
    if (r.skipped) {
      ImGui::TextColored(to_vec4(colours::kSkippedText), "skipped");
      ImGui::SameLine();
    }
    ImGui::TextDisabled("loss %s, scale %s", format_number(r.loss).c_str(), format_number(r.scale).c_str());
  }
}

// The early anomaly's provisional label while it is selected (app.h, early_shown), else why the selection moved when
// the analysis ended (anomaly_note): wrapped, in the warning colour, so nobody takes the one for the analysis's verdict.
void early_anomaly_line(const ViewerState& s) {
  std::string text;
  if (s.early_shown && s.a->early_anomaly()) {
    text = early_anomaly_label(*s.a->early_anomaly(), s.a->analysis_progress(), s.a->analysing());
  } else {
    text = s.anomaly_note;
  }
  if (text.empty()) return;
  ImGui::PushTextWrapPos(0.0f);
  ImGui::TextColored(to_vec4(colours::kWarning), "%s", text.c_str());
  ImGui::PopTextWrapPos();
}

// The rank shown, for a data-parallel run's traces: a combo of the open ranks, each with its anomalies once
// analysed. Draws nothing without a rank set; otherwise leaves the cursor on the same line.
void rank_picker(ViewerState& s) {
  if (s.ranks.size() < 2) return;
  const auto item = [&](std::size_t i) {
    const TraceDocument* d = rank_document(s, i);
    return rank_item_label({.rank = s.ranks[i].rank, .report = d ? d->report() : nullptr, .analysing = d && d->analysing()});
  };
  ImGui::AlignTextToFramePadding();
  ImGui::SetNextItemWidth(170);
  if (ImGui::BeginCombo("##rank", fmt::format("rank {} of {}", s.ranks[s.rank_shown].rank, s.ranks.size()).c_str())) {
    for (std::size_t i = 0; i < s.ranks.size(); ++i) {
      ImGui::PushStyleColor(ImGuiCol_Text, to_vec4(rank_colour(s.ranks[i].rank)));
      const bool chosen = ImGui::Selectable(item(i).c_str(), i == s.rank_shown);
      ImGui::PopStyleColor();
      if (chosen) select_rank(s, s.ranks[i].rank);
    }
    ImGui::EndCombo();
  }
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("A data-parallel run: one trace per rank. The ops, anomalies and op detail are this rank's; the "
                      "Scale and loss plots draw every rank (one line per rank).");
  ImGui::SameLine();
}

// One cell per pixel column (or per step when they fit): magenta where a step in it was skipped. Clicking
// selects the step under the mouse.
void step_strip(ViewerState& s, float height) {
  const auto& steps = s.a->steps();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 p = ImGui::GetCursorScreenPos();
  const float w = std::max(10.0f, ImGui::GetContentRegionAvail().x);
  const float x0 = std::floor(p.x), y0 = std::floor(p.y);
  ImGui::InvisibleButton("##strip", ImVec2(w, height));
  if (steps.empty()) return;
  const std::size_t n = steps.size();
  const int cells = static_cast<int>(std::min<std::size_t>(n, static_cast<std::size_t>(w)));
  const float cell_w = w / static_cast<float>(cells);
  const auto selected = s.a->selected_step();
  for (int c = 0; c < cells; ++c) {
    const std::size_t begin = c * n / cells, end = std::max(begin + 1, (c + 1) * n / cells);
    bool skipped = false, is_selected = false;
    for (std::size_t i = begin; i < end && i < n; ++i) {
      skipped |= steps[i].skipped;
      is_selected |= selected && steps[i].step == *selected;
    }
    const float cx0 = std::floor(x0 + c * cell_w), cx1 = std::max(cx0 + 1, std::floor(x0 + (c + 1) * cell_w) - (cell_w >= 4 ? 1 : 0));
    dl->AddRectFilled(ImVec2(cx0, y0), ImVec2(cx1, y0 + height), skipped ? colours::kSkippedStep : colours::kHealthyStep);
    if (is_selected) dl->AddRect(ImVec2(cx0, y0), ImVec2(cx1, y0 + height), colours::kSelectedStep);
  }
  if (ImGui::IsItemHovered()) {
    const float mx = ImGui::GetIO().MousePos.x - x0;
    const std::size_t i = std::min(n - 1, static_cast<std::size_t>(std::max(0.0f, mx) / w * static_cast<float>(n)));
    const auto& r = steps[i];
    ImGui::SetTooltip("step %lld%s\nloss %s, scale %s -> %s", static_cast<long long>(r.step),
                      r.skipped ? " (skipped)" : "", format_number(r.loss).c_str(), format_number(r.scale).c_str(),
                      format_number(r.scale_after).c_str());
    if (ImGui::IsItemClicked()) select_step(s, r.step);
  }
}

ImU32 im(std::uint32_t c) { return static_cast<ImU32>(c); }

// A small filled square on the current line (a legend swatch, a link's health), then the cursor after it.
void swatch(std::uint32_t fill, std::uint32_t border) {
  const float size = ImGui::GetFontSize() * 0.8f;
  const ImVec2 p = ImGui::GetCursorScreenPos();
  const float y = std::floor(p.y + (ImGui::GetTextLineHeight() - size) / 2);
  if (fill != 0) {
    ImDrawList* dl = ImGui::GetWindowDrawList();
    dl->AddRectFilled(ImVec2(std::floor(p.x), y), ImVec2(std::floor(p.x + size), y + size), im(fill));
    if (border != 0) dl->AddRect(ImVec2(std::floor(p.x), y), ImVec2(std::floor(p.x + size), y + size), im(border));
  }
  ImGui::Dummy(ImVec2(size, ImGui::GetTextLineHeight()));
  ImGui::SameLine();
}

std::string positions_text(const std::vector<int>& positions) {
  std::string out = positions.size() == 1 ? "input " : "inputs ";
  for (std::size_t i = 0; i < positions.size(); ++i) out += (i ? ", " : "") + std::to_string(positions[i]);
  return out;
}

// Op detail's inputs or consumers: a row is a line that selects it when clicked (its swatch red when its
// output holds NaN/inf, else its dtype's colour), with its health below; a marker is said in words.
void draw_links(ViewerState& s, const char* id, const std::vector<OpLink>& links, bool are_inputs) {
  ImGui::PushID(id);
  for (std::size_t i = 0; i < links.size(); ++i) {
    const OpLink& l = links[i];
    ImGui::PushID(static_cast<int>(i));
    const std::string where = positions_text(l.positions);
    if (l.found) {
      swatch(l.nonfinite ? colours::kNonFiniteCell : dtype_colour(l.out_dtype), 0);
      // The input's position leads an input's line; a consumer's (where it takes this op in) leads its
      // second line, so the narrow column keeps the op's name in view.
      const std::string label = are_inputs ? fmt::format("{}: {}", l.positions.front(), l.text) : l.text;
      const std::string second = are_inputs ? l.health : fmt::format("as {}; {}", where, l.health);
      if (ImGui::Selectable(label.c_str(), false)) select_op(s, l.seq);
      if (ImGui::IsItemHovered()) ImGui::SetTooltip("click: select seq %lld", static_cast<long long>(l.seq));
      ImGui::Indent(ImGui::GetFontSize());
      ImGui::PushTextWrapPos(0.0f);
      if (l.nonfinite) {
        ImGui::TextColored(to_vec4(colours::kWarning), "%s", second.c_str());
      } else {
        ImGui::TextDisabled("%s", second.c_str());
      }
      ImGui::PopTextWrapPos();
      ImGui::Unindent(ImGui::GetFontSize());
    } else {
      swatch(0, 0);
      ImGui::PushTextWrapPos(0.0f);
      const std::string text = are_inputs && !l.positions.empty() ? fmt::format("{}: {}", l.positions.front(), l.text) : l.text;
      if (l.seq >= 0) {
        ImGui::TextColored(to_vec4(colours::kWarning), "%s", text.c_str());  // a seq the step does not hold
      } else {
        ImGui::TextDisabled("%s", text.c_str());
      }
      ImGui::PopTextWrapPos();
    }
    ImGui::PopID();
  }
  ImGui::PopID();
}

// A root-cause chain, root first: each link a line that selects its op (in its step), the one at `current`
// highlighted; with `evidence`, each link's sentence below it, else in its tooltip.
void draw_chain(ViewerState& s, const std::vector<ChainItem>& chain, int current, bool evidence) {
  for (std::size_t i = 0; i < chain.size(); ++i) {
    const ChainItem& c = chain[i];
    ImGui::PushID(static_cast<int>(i));
    const bool root = i == 0, origin = i + 1 == chain.size();
    swatch(origin ? colours::kOriginMark : root ? colours::kWarning : colours::kZeroBar, 0);
    const std::string label = fmt::format("{}{} ({})", i == 0 ? "" : "-> ", c.text, c.role);
    if (ImGui::Selectable(label.c_str(), static_cast<int>(i) == current) && c.step >= 0) {
      if (s.a && s.a->selected_step() == c.step) {
        select_op(s, c.seq);
      } else {
        select_step(s, c.step, c.seq);
      }
    }
    if (ImGui::IsItemHovered()) {
      ImGui::BeginTooltip();
      ImGui::PushTextWrapPos(ImGui::GetFontSize() * 35.0f);
      ImGui::Text("click: select step %lld, seq %lld", static_cast<long long>(c.step), static_cast<long long>(c.seq));
      if (!evidence) ImGui::TextUnformatted(c.evidence.c_str());
      ImGui::PopTextWrapPos();
      ImGui::EndTooltip();
    }
    if (evidence && !c.evidence.empty()) {
      ImGui::Indent(ImGui::GetFontSize() * 2);
      ImGui::PushTextWrapPos(0.0f);
      ImGui::TextDisabled("%s", c.evidence.c_str());
      ImGui::PopTextWrapPos();
      ImGui::Unindent(ImGui::GetFontSize() * 2);
    }
    ImGui::PopID();
  }
}

// Text on a dark box (a command-line option, C++ lines), wrapped to the panel, with a copy button.
void code_block(const char* id, const std::string& text) {
  ImGui::PushID(id);
  if (ImGui::SmallButton("copy")) ImGui::SetClipboardText(text.c_str());
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("copy to the clipboard");
  ImGui::SameLine();
  const ImVec2 p = ImGui::GetCursorScreenPos();
  const float wrap = std::max(40.0f, ImGui::GetContentRegionAvail().x - 8);
  const ImVec2 size = ImGui::CalcTextSize(text.c_str(), nullptr, false, wrap);
  ImGui::GetWindowDrawList()->AddRectFilled(ImVec2(p.x - 2, p.y - 1), ImVec2(p.x + size.x + 4, p.y + size.y + 1),
                                            im(rgba(35, 38, 48)));
  ImGui::PushTextWrapPos(ImGui::GetCursorPos().x + wrap);
  ImGui::TextColored(ImVec4(0.85f, 0.92f, 1.0f, 1), "%s", text.c_str());
  ImGui::PopTextWrapPos();
  ImGui::PopID();
}

}  // namespace

void draw_errors(ViewerState& s) {
  if (!begin_panel("Errors", s.layout.errors)) return;
  for (std::size_t i = 0; i < s.errors.size(); ++i) error_box(s.errors[i]);
  if (ImGui::SmallButton("dismiss")) s.errors.clear();
  ImGui::End();
}

void draw_overview_panel(ViewerState& s) {
  if (!begin_panel("Overview", s.layout.overview)) return;
  if (need_trace(s)) {
    const TraceDocument& d = *s.a;
    if (s.ranks.size() >= 2) {
      rank_picker(s);
      ImGui::TextDisabled("data-parallel run, %zu rank traces open", s.ranks.size());
    }
    if (d.live()) {
      ImGui::TextColored(to_vec4(colours::kWarning), "LIVE: the trace is being written (refreshed every second)");
    }
    if (d.report()) {
      for (const std::string& note : d.report()->damage) error_box("DAMAGED: " + note + "; analysed what is intact");
    }
    OverviewInput in{.path = d.path().string(), .run = d.run_info(), .steps = d.steps(), .counts = d.counts(),
                     .complete = d.complete(), .report = d.report(), .analysis_progress = d.analysis_progress()};
    auto rows = overview_rows(in);
    // The config is long JSON: it gets its own collapsible section below.
    std::string config;
    if (!rows.empty() && rows.back().key == "config") {
      config = rows.back().value;
      rows.pop_back();
    }
    if (!d.report() && d.analysing()) {
      ImGui::ProgressBar(static_cast<float>(d.analysis_progress()), ImVec2(-1, 0), "analysing...");
    }
    if (!d.analysis_error().empty()) error_box(d.analysis_error());
    key_value_table("##overview", rows);
    if (s.b) {
      ImGui::Spacing();
      ImGui::TextDisabled("compared with (b): %s (%s %s)", s.b->path().string().c_str(), s.b->run_info().model.c_str(),
                          s.b->run_info().precision.c_str());
    }
    if (!config.empty() && ImGui::CollapsingHeader("config")) {
      ImGui::PushTextWrapPos(0.0f);
      ImGui::TextUnformatted(config.c_str());
      ImGui::PopTextWrapPos();
    }
  }
  ImGui::End();
}

void draw_scale_panel(ViewerState& s) {
  if (!begin_panel("Scale and loss", s.layout.scale)) return;
  if (!need_trace(s)) {
    ImGui::End();
    return;
  }
  const auto& steps = s.a->steps();
  if (s.series_steps != steps.size()) {
    // New steps (a live trace, about once a second): refit only the axes the user has not zoomed or
    // panned, so a zoomed plot stays put; a double click on a plot makes it follow again.
    s.series = step_series(steps);
    s.series_steps = steps.size();
    plot::follow_data(s.shared_x);
    for (plot::State* p : {&s.scale_plot, &s.loss_plot, &s.norm_plot}) plot::follow_data(p->y);
  }
  rank_picker(s);
  step_picker(s);
  if (s.ranks.size() >= 2) {
    // One line per rank: computed again when a rank's steps grew (a live run).
    std::vector<std::size_t> counts;
    for (std::size_t i = 0; i < s.ranks.size(); ++i) counts.push_back(rank_document(s, i) ? rank_document(s, i)->steps().size() : 0);
    if (counts != s.rank_lines_steps) {
      std::vector<RankSteps> in;
      for (std::size_t i = 0; i < s.ranks.size(); ++i) {
        const TraceDocument* d = rank_document(s, i);
        in.push_back({s.ranks[i].rank, d ? std::span<const trace::StepRow>(d->steps()) : std::span<const trace::StepRow>()});
      }
      s.rank_lines = rank_lines(in);
      s.rank_lines_steps = counts;
      plot::follow_data(s.shared_x);
      for (plot::State* p : {&s.scale_plot, &s.loss_plot, &s.norm_plot}) plot::follow_data(p->y);
    }
  } else {
    s.rank_lines.clear();
  }
  if (steps.empty()) {
    ImGui::TextDisabled("No steps recorded yet.");
    ImGui::End();
    return;
  }
  std::vector<plot::Marker> markers;
  markers.reserve(s.series.skipped.size() + s.series.backoffs.size() + s.series.growths.size() + 1);
  for (double x : s.series.backoffs) markers.push_back({x, im(colours::kBackoff), "scale backoff"});
  for (double x : s.series.growths) markers.push_back({x, im(colours::kGrowth), "scale growth"});
  for (double x : s.series.skipped) markers.push_back({x, im(colours::kSkippedStep), "skipped step"});
  if (auto sel = s.a->selected_step()) markers.push_back({static_cast<double>(*sel), im(colours::kSelectedStep), "selected"});

  const float avail = ImGui::GetContentRegionAvail().y;
  const float strip_h = 14;
  const float legend_h = ImGui::GetTextLineHeightWithSpacing();
  const float plot_h = std::max(60.0f, (avail - strip_h - legend_h - 4 * ImGui::GetStyle().ItemSpacing.y) / 3.0f);

  // With a rank set, each plot draws every rank's line (the shown rank's with markers), named in the legend.
  auto lines = [&](const plot::Series& series, std::vector<double> StepSeries::*values) {
    std::vector<plot::Series> out;
    if (s.rank_lines.empty()) {
      out.push_back(series);
      return out;
    }
    for (std::size_t i = 0; i < s.rank_lines.size(); ++i) {
      const RankLine& l = s.rank_lines[i];
      out.push_back({.label = l.label, .x = l.series.step, .y = l.series.*values, .colour = im(l.colour),
                     .style = i == s.rank_shown ? plot::Style::line_and_markers : plot::Style::line});
    }
    return out;
  };
  auto draw_one = [&](const char* id, plot::State& st, const std::vector<plot::Series>& series, plot::Scale yscale,
                      const char* ylabel) {
    st.x = s.shared_x;
    st.y.scale = yscale;
    st.y.label = ylabel;
    st.x.label = "step";
    st.x.integer = true;
    plot::Result r = plot::draw(id, st, series, markers, ImVec2(-1, plot_h));
    s.shared_x = st.x;
    if (r.clicked) {
      if (auto n = nearest_step(steps, r.clicked_x)) select_step(s, *n);
    }
  };
  plot::Series scale{.label = "loss scale", .x = s.series.step, .y = s.series.scale, .colour = im(colours::kScale),
                     .style = plot::Style::line_and_markers};
  plot::Series loss{.label = "loss", .x = s.series.step, .y = s.series.loss, .colour = im(colours::kLoss),
                    .style = plot::Style::line_and_markers};
  plot::Series norm{.label = "gradient norm", .x = s.series.step, .y = s.series.grad_norm,
                    .colour = im(colours::kGradNorm), .style = plot::Style::line_and_markers};
  ImGui::SameLine();
  ImGui::TextColored(to_vec4(colours::kSkippedText), "| skipped");
  ImGui::SameLine();
  ImGui::TextColored(to_vec4(colours::kBackoff), "| backoff");
  ImGui::SameLine();
  ImGui::TextColored(to_vec4(colours::kGrowth), "| growth");
  ImGui::SameLine();
  ImGui::TextColored(to_vec4(colours::kSelectedStep), "| selected");
  ImGui::SameLine();
  help_marker("Wheel: zoom, drag: pan, click: select the step, double click: fit the data again (and follow new "
              "steps of a live trace, which a zoomed or panned axis no longer does). The x axes of the three plots "
              "move together. A data-parallel run draws one line per rank (the legend names them; the rank shown "
              "has markers, and the skip, backoff and growth markers are its own).");
  draw_one("##scale", s.scale_plot, lines(scale, &StepSeries::scale), plot::Scale::log2, "loss scale (log2)");
  s.loss_plot.empty_note_box = s.norm_plot.empty_note_box = colours::kPlotNote;
  s.loss_plot.empty_note = "no finite loss to draw: every recorded loss is NaN or inf (Why NaN? says why)";
  draw_one("##loss", s.loss_plot, lines(loss, &StepSeries::loss), plot::Scale::linear,
           s.rank_lines.empty() ? "loss" : "loss (each rank's share)");
  s.norm_plot.empty_note = "no finite gradient norm to draw: every step's gradients held NaN or inf";
  draw_one("##norm", s.norm_plot, lines(norm, &StepSeries::grad_norm), plot::Scale::log10, "gradient norm (log10)");
  ImGui::TextDisabled("steps (magenta: skipped)");
  step_strip(s, strip_h);
  ImGui::End();
}

void draw_ops_panel(ViewerState& s) {
  if (!begin_panel("Ops", s.layout.ops)) return;
  s.ops_table_drawn = false;
  if (!need_trace(s)) {
    ImGui::End();
    return;
  }
  rank_picker(s);
  step_picker(s);
  early_anomaly_line(s);
  ImGui::SetNextItemWidth(220);
  if (ImGui::InputTextWithHint("##filter", "filter: module, op, dtype, phase", s.filter_text, sizeof s.filter_text)) {
    s.filter.text = s.filter_text;
    s.op_rows_dirty = true;
  }
  ImGui::SameLine();
  if (ImGui::Checkbox("NaN/inf only", &s.filter.nonfinite_only)) s.op_rows_dirty = true;

  const StepData* d = s.a->step_data();
  if (!s.a->step_error().empty()) {
    error_box(s.a->step_error());
    // Selecting the step again reads it again (the file may have been a moment away, or is being written).
    if (ImGui::Button("retry") && s.a->selected_step()) select_step(s, *s.a->selected_step(), s.selected_seq);
    ImGui::End();
    return;
  }
  if (!d) {
    ImGui::TextDisabled(s.a->selected_step() ? "loading the step's ops..." : "select a step");
    ImGui::End();
    return;
  }
  if (d->load_id != s.op_rows_for) s.op_rows_dirty = true;
  ImGui::SameLine();
  ImGui::TextDisabled("%s of %s ops", format_count(static_cast<std::int64_t>(s.op_rows_dirty ? 0 : s.op_rows.size())).c_str(),
                      format_count(static_cast<std::int64_t>(d->ops.size())).c_str());

  constexpr ImGuiTableFlags flags = ImGuiTableFlags_Sortable | ImGuiTableFlags_ScrollY | ImGuiTableFlags_ScrollX |
                                    ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_Resizable |
                                    ImGuiTableFlags_Hideable | ImGuiTableFlags_SizingFixedFit;
  if (ImGui::BeginTable("##ops", kOpColumns, flags, ImVec2(0, ImGui::GetContentRegionAvail().y))) {
    ImGui::TableSetupScrollFreeze(1, 1);
    for (int c = 0; c < kOpColumns; ++c) {
      const auto col = static_cast<OpColumn>(c);
      ImGuiTableColumnFlags cf = c == 0 ? ImGuiTableColumnFlags_DefaultSort : 0;
      float width = 0;
      if (col == OpColumn::module) width = 160;
      if (col == OpColumn::dtypes) width = 130;
      ImGui::TableSetupColumn(std::string(op_column_name(col)).c_str(), cf, width, static_cast<ImGuiID>(c));
    }
    // Headers by hand so each can carry its definition in a tooltip.
    ImGui::TableNextRow(ImGuiTableRowFlags_Headers);
    for (int c = 0; c < kOpColumns; ++c) {
      if (!ImGui::TableSetColumnIndex(c)) continue;
      ImGui::TableHeader(ImGui::TableGetColumnName(c));
      if (ImGui::IsItemHovered()) {
        const auto help = op_column_help(static_cast<OpColumn>(c));
        ImGui::SetTooltip("%.*s", static_cast<int>(help.size()), help.data());
      }
    }
    if (ImGuiTableSortSpecs* specs = ImGui::TableGetSortSpecs()) {
      if (specs->SpecsDirty && specs->SpecsCount > 0) {
        s.sort_column = static_cast<OpColumn>(specs->Specs[0].ColumnUserID);
        s.sort_ascending = specs->Specs[0].SortDirection == ImGuiSortDirection_Ascending;
        s.op_rows_dirty = true;
      }
      specs->SpecsDirty = false;
    }
    if (s.op_rows_dirty) {
      s.op_rows = op_order(d->ops, s.filter, s.sort_column, s.sort_ascending);
      s.op_rows_for = d->load_id;
      s.op_rows_dirty = false;
    }
    if (s.scroll_to_selected && s.selected_seq && s.op_row_height > 0) {
      for (std::size_t i = 0; i < s.op_rows.size(); ++i) {
        if (d->ops[s.op_rows[i]].seq == *s.selected_seq) {
          ImGui::SetScrollY(std::max(0.0f, static_cast<float>(i) * s.op_row_height - 3 * s.op_row_height));
          break;
        }
      }
      s.scroll_to_selected = false;
    }
    if (s.bench_scroll_pixels > 0) {
      float y = ImGui::GetScrollY() + s.bench_scroll_pixels;
      if (y > ImGui::GetScrollMaxY()) y = 0;
      ImGui::SetScrollY(y);
    }

    ImGuiListClipper clipper;
    clipper.Begin(static_cast<int>(s.op_rows.size()));
    while (clipper.Step()) {
      for (int i = clipper.DisplayStart; i < clipper.DisplayEnd; ++i) {
        const trace::OpRow& row = d->ops[s.op_rows[static_cast<std::size_t>(i)]];
        ImGui::TableNextRow();
        const bool nonfinite = nonfinite_count(row.health) > 0;
        for (int c = 0; c < kOpColumns; ++c) {
          if (!ImGui::TableSetColumnIndex(c)) continue;
          const auto col = static_cast<OpColumn>(c);
          const std::string text = op_cell(row, col);
          switch (col) {
            case OpColumn::seq: {
              if (row.origin) ImGui::TableSetBgColor(ImGuiTableBgTarget_CellBg, im(colours::kOriginMark));
              const bool is_selected = s.selected_seq && *s.selected_seq == row.seq;
              // The row's index, not its seq: a damaged or merged trace can repeat a seq within a step.
              ImGui::PushID(static_cast<int>(s.op_rows[static_cast<std::size_t>(i)]));
              if (ImGui::Selectable(text.c_str(), is_selected,
                                    ImGuiSelectableFlags_SpanAllColumns | ImGuiSelectableFlags_AllowItemOverlap)) {
                s.selected_seq = row.seq;
              }
              if (row.origin && ImGui::IsItemHovered()) ImGui::SetTooltip("origin: NaN/inf created here from finite inputs");
              ImGui::PopID();
              break;
            }
            case OpColumn::op:
              if (row.origin) {
                ImGui::TextColored(to_vec4(colours::kOriginMark), "> %s", text.c_str());
              } else {
                ImGui::TextUnformatted(text.c_str());
              }
              break;
            case OpColumn::dtypes:
              ImGui::TextColored(to_vec4(dtype_colour(row.out_dtype)), "%s", text.c_str());
              break;
            case OpColumn::nonfinite:
              if (nonfinite) {
                ImGui::TableSetBgColor(ImGuiTableBgTarget_CellBg, im(colours::kNonFiniteCell));
                ImGui::TextColored(ImVec4(1, 1, 1, 1), "%s", text.c_str());
              } else {
                ImGui::TextUnformatted(text.c_str());
              }
              break;
            case OpColumn::absmax:
            case OpColumn::mean:
            case OpColumn::rms:
              if (text == "nan" || text == "inf" || text == "-inf") {
                ImGui::TextColored(to_vec4(colours::kNonFiniteCell), "%s", text.c_str());
              } else if (col == OpColumn::absmax && row.health.absmax * 2 >= analysis::kF16Max) {
                ImGui::TextColored(to_vec4(colours::kWarning), "%s", text.c_str());
              } else {
                ImGui::TextUnformatted(text.c_str());
              }
              break;
            default:
              ImGui::TextUnformatted(text.c_str());
          }
        }
      }
      if (clipper.ItemsHeight > 0) s.op_row_height = clipper.ItemsHeight;
    }
    s.ops_table_drawn = true;
    ImGui::EndTable();
  }
  ImGui::End();
}

void draw_error_histogram(ViewerState& s, const trace::PrecisionRow& p, float height);

// The Op detail panel when no /ops row is selected: a twinned op whose step's /ops rows were not written
// (--sample-every) shows the twin's numbers alone; otherwise a hint.
void draw_detail_without_row(ViewerState& s) {
  const PrecisionMap* pm = s.a->precision();
  const std::optional<std::int64_t> step = s.a->selected_step();
  const trace::PrecisionRow* twin =
      pm && step && s.selected_seq && s.a->step_data() ? precision_at(*pm, *step, *s.selected_seq) : nullptr;
  if (twin) {
    ImGui::Text("%s  %s", twin->op.c_str(), twin->module.empty() ? "(no module)" : twin->module.c_str());
    ImGui::SameLine();
    ImGui::TextDisabled("step %lld, seq %lld, %s: no /ops row in this trace (a step --sample-every did not write)",
                        static_cast<long long>(twin->step), static_cast<long long>(twin->seq), twin->out_dtype.c_str());
    const ImVec2 avail = ImGui::GetContentRegionAvail();
    ImGui::BeginChild("##twin_rows", ImVec2(avail.x >= 600 ? std::min(360.0f, avail.x * 0.42f) : 0, avail.x >= 600 ? 0 : std::floor(avail.y * 0.5f)), false);
    key_value_table("##precision", precision_detail_rows(*twin), 90);
    ImGui::EndChild();
    if (avail.x >= 600) ImGui::SameLine();
    ImGui::BeginChild("##twin_histogram", ImVec2(0, 0), false);
    draw_error_histogram(s, *twin, std::max(100.0f, ImGui::GetContentRegionAvail().y - 4));
    ImGui::EndChild();
    return;
  }
  ImGui::TextDisabled(s.a->step_data() ? "Select an op in the Ops table (or a card in Why NaN?)."
                                       : "loading the step's ops...");
}

// Where the op's inputs came from, who takes its output, and the root-cause chain through it: what a click
// follows.
void draw_detail_dataflow(ViewerState& s, const trace::OpRow& op) {
  ImGui::TextColored(to_vec4(colours::kLoss), "inputs");
  help_marker("Where each input came from (the trace's provenance, /ops inputs): the row of this step that "
              "produced it (click to select it; the swatch is red when its output holds NaN/inf, else its dtype's "
              "colour), or a parameter, data or a constant, an op the trace did not record, or gradients summed "
              "by autograd.");
  if (s.detail_producers.empty()) {
    ImGui::TextDisabled("none (the op takes no tensor inputs)");
  } else {
    draw_links(s, "##producers", s.detail_producers, true);
  }
  ImGui::TextColored(to_vec4(colours::kLoss), "consumers");
  help_marker("The rows of this step that take this op's output in, and as which input (click to select one).");
  if (s.detail_consumers.empty()) {
    const bool known = !s.detail_producers.empty() && s.detail_producers.front().marker == trace::kInputUnknown;
    ImGui::TextDisabled(known ? "unknown: this trace has no provenance (format_version 1)"
                              : "none in this step (an output, a loss, or its users were not recorded)");
  } else {
    draw_links(s, "##consumers", s.detail_consumers, false);
  }
  if (const analysis::Report* rep = s.a->report()) {
    const DiagnosisAt at = diagnosis_at(*rep, op.step, op.seq);
    if (at.diagnosis != nullptr && !at.diagnosis->chain.empty()) {
      ImGui::TextColored(to_vec4(colours::kOriginMark), "root cause: %s", at.diagnosis->root_cause.c_str());
      help_marker("The analysis's walk from the origin upstream: the op that caused it first, the origin last "
                  "(click a link to select it; hover for its evidence). Why NaN? shows the remedies.");
      draw_chain(s, chain_items(*at.diagnosis), at.link, false);
    } else if (at.diagnosis != nullptr && op.origin) {
      ImGui::TextDisabled("root cause: none found upstream (%s)", at.diagnosis->cause.c_str());
    }
  }
}

// The op output's exponent histogram over f16's zones, with the special bins (zero, subnormal, inf, NaN)
// beside it on the same y axis; a note when the probe level recorded none.
void draw_detail_histogram(ViewerState& s, const trace::OpRow& op, const StepData* d) {
  std::optional<ExponentHistogram> h = d ? op_histogram(d->histograms, op.seq, op.out_dtype) : std::nullopt;
  if (!h) {
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextDisabled(
        "No exponent histogram was recorded for this op: histograms are written at probe level full "
        "(ampscope train --probe full). The health numbers on the left are what was recorded.");
    ImGui::PopTextWrapPos();
  } else {
    using half_ranges::kF16;
    ImGui::Text("exponent histogram of the %s output (%s values)", h->dtype.c_str(), format_count(h->total).c_str());
    // Bars over log2|x| (bin e is the bar over [e, e + 1)), drawn over f16's zones (probes/analysis/f16_ranges.h).
    std::vector<plot::Band> bands;
    for (const ZoneBand& z : f16_zone_bands()) bands.push_back({z.x0, z.x1, im(z.colour), z.label});
    const double s_exp = kF16.min_subnormal_exponent();
    std::vector<plot::Marker> markers = {
        {std::log2(kF16.overflow_threshold()), im(colours::kF16Range),
         "65520: inf from here (f16's max is 65504; 65520 ties to inf)"},
        {static_cast<double>(kF16.min_normal_exponent), im(colours::kF16Range), "f16 smallest normal 2^-14; subnormal below"},
        {s_exp, im(colours::kF16Range), "f16 smallest subnormal 2^-24"},
        {s_exp - 1, im(colours::kF16Range), "2^-25: rounds to 0; above it, up to 2^-24"},
    };
    plot::Series series{.label = "values", .x = h->exponent, .y = h->count, .colour = im(colours::kHistogramBar),
                        .style = plot::Style::bars};
    const std::vector<Bar> special = special_bars(*h);
    // The x range always spans f16's range and a few bins beyond each end, so the data are seen against it
    // and the overflow and flush-to-zero zones show even when nothing falls in them.
    if (s.histogram_seq != op.seq || s.histogram_load != (d ? d->load_id : 0)) {
      s.histogram_seq = op.seq;
      s.histogram_load = d ? d->load_id : 0;
      const double lo = h->exponent.empty() ? 0 : h->exponent.front(), hi = h->exponent.empty() ? 0 : h->exponent.back() + 1;
      s.histogram_plot.x = {.scale = plot::Scale::linear, .min = std::min(lo - 1, s_exp - 5.0),
                            .max = std::max(hi + 1, kF16.max_exponent + 6.0), .fit = false, .label = ""};
      s.histogram_plot.y.fit = true;
    }
    s.histogram_plot.y.scale = plot::Scale::log10;
    // Counts from 1 (the bars' floor) to the largest bar, the special bins' included.
    s.histogram_plot.y.fit_also = {1.0};
    for (const Bar& b : special) s.histogram_plot.y.fit_also.push_back(b.count);
    s.histogram_plot.x.label = "log2|x| (bin e: [2^e, 2^(e+1)))";
    s.histogram_plot.y.label = "values";
    s.histogram_plot.legend = false;
    const float plot_h = std::max(80.0f, ImGui::GetContentRegionAvail().y - 6 * ImGui::GetTextLineHeightWithSpacing());
    // The special bins beside the exponent bars, on the same y axis.
    const float special_w = std::max(170.0f, ImGui::GetFontSize() * 14);
    const float main_w = std::max(120.0f, ImGui::GetContentRegionAvail().x - special_w - ImGui::GetStyle().ItemSpacing.x);
    plot::draw("##hist", s.histogram_plot, {&series, 1}, markers, ImVec2(main_w, plot_h), bands);
    ImGui::SameLine();
    {
      std::vector<double> x, y;
      std::vector<ImU32> bar_colours;
      plot::State& sp = s.histogram_special;
      sp.x = {.scale = plot::Scale::linear, .min = 0, .max = static_cast<double>(special.size()), .fit = false,
              .label = "other bins"};  // a label as the main plot has: both plot areas end at the same height
      sp.x.labels.clear();
      for (std::size_t i = 0; i < special.size(); ++i) {
        x.push_back(static_cast<double>(i) + 0.15);
        y.push_back(special[i].count);
        bar_colours.push_back(im(special[i].colour));
        sp.x.labels.push_back({static_cast<double>(i) + 0.5, special[i].label});
      }
      sp.y = s.histogram_plot.y;  // after the main plot's fit: one scale (and label) for every bar
      sp.legend = false;
      plot::Series bars{.label = "values", .x = x, .y = y, .colour = im(colours::kHistogramBar),
                        .style = plot::Style::bars, .bar_width = 0.7, .bar_colours = bar_colours};
      const plot::Result r = plot::draw("##hist_special", sp, {&bars, 1}, {}, ImVec2(special_w, plot_h));
      if (r.hovered && ImGui::IsMouseDoubleClicked(0)) {
        s.histogram_plot.y.fit = true;  // refit over every bar, next frame
      } else if (r.hovered) {
        // A zoom or pan of y here moves the main plot's y too; x stays on the four bars.
        s.histogram_plot.y.min = sp.y.min;
        s.histogram_plot.y.max = sp.y.max;
        s.histogram_plot.y.follow = sp.y.follow;
      }
    }
    // Each zone's line starts with a swatch of its shade: the legend of the bands.
    auto line = [](std::uint32_t fill, std::uint32_t colour, const std::string& text) {
      swatch(fill, colour);
      ImGui::TextColored(to_vec4(colour), "%s", text.c_str());
    };
    for (const ZoneLine& l : f16_zone_lines(*h)) line(l.swatch, l.colour, l.text);
    line(0, colours::kBf16Range,
         fmt::format("bf16: 2^{} .. {:.3g}, every finite bin fits (8 bits)", half_ranges::kBf16.min_subnormal_exponent(),
                     half_ranges::kBf16.max_finite()));
  }
}

void draw_detail_panel(ViewerState& s) {
  if (!begin_panel("Op detail", s.layout.detail)) return;
  if (!need_trace(s)) {
    ImGui::End();
    return;
  }
  const trace::OpRow* row = selected_op(s);
  if (!row) {
    draw_detail_without_row(s);
    ImGui::End();
    return;
  }
  ImGui::Text("%s  %s", row->op.c_str(), row->module.empty() ? "(no module)" : row->module.c_str());
  if (row->origin) {
    ImGui::SameLine();
    ImGui::TextColored(to_vec4(colours::kOriginMark), "origin");
  }
  ImGui::SameLine();
  ImGui::TextDisabled("step %lld, seq %lld, %s, %s", static_cast<long long>(row->step), static_cast<long long>(row->seq),
                      dtype_arrow(*row).c_str(), row->shape.c_str());
  const StepData* d = s.a->step_data();
  // The dataflow around the op: computed once per op (a step may hold a million rows).
  const std::uint64_t load = d ? d->load_id : 0;
  if (s.detail_links_seq != row->seq || s.detail_links_load != load) {
    const std::span<const trace::OpRow> rows = d ? std::span<const trace::OpRow>(d->ops) : std::span<const trace::OpRow>();
    s.detail_producers = producers(*row, rows);
    s.detail_consumers = consumers(*row, rows);
    s.detail_links_seq = row->seq;
    s.detail_links_load = load;
  }
  // Side by side when there is room; in the default layout's narrow column a side table would leave its
  // values a few letters wide, so the table goes above the histogram there.
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const bool side_by_side = avail.x >= 600;
  const ImVec2 table_size = side_by_side ? ImVec2(std::min(360.0f, avail.x * 0.42f), 0) : ImVec2(0, std::floor(avail.y * 0.5f));
  ImGui::BeginChild("##detail_rows", table_size, false);
  // A twinned op's precision first (the Precision panel's clicks come here for it).
  const PrecisionMap* pm = s.a->precision();
  const trace::PrecisionRow* twin = pm ? precision_at(*pm, row->step, row->seq) : nullptr;
  if (twin) {
    ImGui::TextColored(to_vec4(colours::kLoss), "precision (%s twin)", analysis::reference_of(*twin).c_str());
    help_marker("How far this op's output is from the twin's (ampscope train --twin: f16/bf16 ops computed again in "
                "f32; with --twin-f64, f32 ops in f64): local, on its own inputs (its own "
                "rounding); accumulated, against the twin's value (every earlier op's error in it). Relative errors "
                "are |y - r| / max(|r|, floor); bits of agreement -log2 of the max; the jump is the factor by which "
                "its error exceeds its inputs' (the report's ranking).");
    key_value_table("##precision", precision_detail_rows(*twin), 90);
    ImGui::Separator();
  }
  draw_detail_dataflow(s, *row);
  ImGui::Separator();
  key_value_table("##detail", op_detail_rows(*row), 90);
  ImGui::EndChild();
  if (side_by_side) ImGui::SameLine();
  ImGui::BeginChild("##histogram", ImVec2(0, 0), false);
  if (twin) {
    const float avail_h = ImGui::GetContentRegionAvail().y;
    draw_error_histogram(s, *twin, std::max(100.0f, std::floor(avail_h * 0.45f)));
  }
  draw_detail_histogram(s, *row, d);
  ImGui::EndChild();
  ImGui::End();
}

void draw_why_panel(ViewerState& s) {
  if (!begin_panel("Why NaN?", s.layout.why)) return;
  if (!need_trace(s)) {
    ImGui::End();
    return;
  }
  const analysis::Report* rep = s.a->report();
  early_anomaly_line(s);
  if (!rep) {
    if (!s.a->analysis_error().empty()) {
      error_box(s.a->analysis_error());
    } else {
      ImGui::ProgressBar(static_cast<float>(s.a->analysis_progress()), ImVec2(-1, 0), "analysing...");
    }
    ImGui::End();
    return;
  }
  if (rep->healthy()) {
    ImGui::TextColored(to_vec4(colours::kGrowth), "No NaN or inf: nothing went wrong in this run.");
  }
  const auto cards = why_nan_cards(*rep);
  ImDrawList* dl = ImGui::GetWindowDrawList();
  for (std::size_t i = 0; i < cards.size(); ++i) {
    const Card& c = cards[i];
    const std::uint32_t accent = c.kind == Card::Kind::anomaly ? colours::kNonFiniteCell
                                 : c.kind == Card::Kind::warning ? colours::kWarning
                                                                 : colours::kScale;
    ImGui::PushID(static_cast<int>(i));
    const ImVec2 top = ImGui::GetCursorScreenPos();
    ImGui::Indent(8);
    ImGui::PushStyleColor(ImGuiCol_Text, to_vec4(accent));
    if (ImGui::Selectable(c.title.c_str(), false) && c.step >= 0) {
      select_step(s, c.step, c.seq >= 0 ? std::optional<std::int64_t>(c.seq) : std::nullopt);
      s.user_selected = true;
    }
    ImGui::PopStyleColor();
    if (ImGui::IsItemHovered() && c.step >= 0) ImGui::SetTooltip("click: select step %lld%s", static_cast<long long>(c.step),
                                                                 c.seq >= 0 ? " and the op" : "");
    for (const auto& kv : c.lines) {
      ImGui::TextDisabled("%s", kv.key.c_str());
      ImGui::SameLine(100);
      ImGui::PushTextWrapPos(0.0f);
      if (kv.alert) {
        ImGui::TextColored(to_vec4(accent), "%s", kv.value.c_str());
      } else {
        ImGui::TextUnformatted(kv.value.c_str());
      }
      ImGui::PopTextWrapPos();
    }
    if (!c.chain.empty()) {
      ImGui::TextDisabled("chain");
      ImGui::SameLine(100);
      ImGui::TextDisabled("from the root cause to the origin (click a link to select its op)");
      ImGui::Indent(92);
      draw_chain(s, c.chain, -1, true);
      ImGui::Unindent(92);
    }
    for (std::size_t k = 0; k < c.remedies.size(); ++k) {
      const analysis::Remedy& r = c.remedies[k];
      ImGui::PushID(static_cast<int>(k));
      ImGui::TextDisabled("remedy %d", static_cast<int>(k + 1));
      ImGui::SameLine(100);
      ImGui::PushTextWrapPos(0.0f);
      ImGui::TextColored(to_vec4(colours::kGrowth), "[%s]", r.kind.c_str());
      ImGui::SameLine();
      ImGui::TextUnformatted(r.text.c_str());
      ImGui::PopTextWrapPos();
      ImGui::Indent(92);
      // On a line of its own: after wrapped text, SameLine would leave it the last line's remaining width (a
      // letter a line in the default layout) and push the command lines far below the remedy.
      if (r.verified) {  // the results file of `ampscope fix` beside the trace confirms it
        ImGui::TextColored(to_vec4(colours::kGrowth), "verified by `ampscope fix`");
      }
      if (!r.flag.empty()) {
        ImGui::TextDisabled("ampscope train");
        ImGui::SameLine();
        code_block("##flag", r.flag);
      }
      if (!r.code.empty()) {
        ImGui::TextDisabled("your own loop ");
        ImGui::SameLine();
        code_block("##code", r.code);
      }
      ImGui::Unindent(92);
      ImGui::PopID();
    }
    ImGui::Unindent(8);
    const ImVec2 bottom = ImGui::GetCursorScreenPos();
    dl->AddRectFilled(ImVec2(std::floor(top.x), std::floor(top.y)), ImVec2(std::floor(top.x) + 4, std::floor(bottom.y) - 2), accent);
    ImGui::Separator();
    ImGui::PopID();
  }
  ImGui::End();
}

void draw_compare_panel(ViewerState& s) {
  if (!begin_panel("Compare", s.layout.compare)) return;
  s.compare_hovered = ImGui::IsWindowHovered(ImGuiHoveredFlags_ChildWindows);
  if (!s.a || !s.b) {
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextDisabled("Compare needs two traces: File > Open to compare, drop a .h5 file here, or start "
                        "ampscope-view A.h5 B.h5 (for example the fp16 and fp32 traces of train --compare).");
    ImGui::PopTextWrapPos();
    ImGui::End();
    return;
  }
  if (!s.comparison) s.comparison = std::make_unique<Comparison>(s.a->path(), s.b->path());
  const analysis::DiffReport* d = s.comparison->report();
  if (!d) {
    if (!s.comparison->error().empty()) {
      error_box(s.comparison->error());
    } else {
      ImGui::ProgressBar(static_cast<float>(s.comparison->progress()), ImVec2(-1, 0), "comparing...");
    }
    ImGui::End();
    return;
  }
  const float w = ImGui::GetContentRegionAvail().x;
  ImGui::BeginChild("##compare_left", ImVec2(w * 0.45f, 0), false);
  key_value_table("##compare_summary", compare_summary(*d), 110);
  const CompareSeries cs = compare_series(*d);
  plot::Series series[2] = {
      {.label = "loss a (" + d->run_a.precision + ")", .x = cs.step_a, .y = cs.loss_a, .colour = im(colours::kLoss),
       .style = plot::Style::line_and_markers},
      {.label = "loss b (" + d->run_b.precision + ")", .x = cs.step_b, .y = cs.loss_b, .colour = im(colours::kLossB),
       .style = plot::Style::line_and_markers},
  };
  std::vector<plot::Marker> markers;
  for (double x : cs.skipped_a) markers.push_back({x, im(colours::kSkippedStep), "skipped in a"});
  if (auto sel = s.a->selected_step()) markers.push_back({static_cast<double>(*sel), im(colours::kSelectedStep), "selected"});
  ImGui::TextColored(to_vec4(colours::kLoss), "loss a");
  ImGui::SameLine();
  ImGui::TextColored(to_vec4(colours::kLossB), "loss b");
  ImGui::SameLine();
  ImGui::TextColored(to_vec4(colours::kSkippedText), "| skipped in a");
  s.compare_plot.x.label = "step";
  s.compare_plot.x.integer = true;
  plot::Result r = plot::draw("##compare_loss", s.compare_plot, series, markers,
                              ImVec2(-1, std::max(100.0f, ImGui::GetContentRegionAvail().y * 0.5f)));
  if (r.clicked) {
    if (auto n = nearest_step(s.a->steps(), r.clicked_x)) select_step(s, *n);
  }
  if (!d->dtype_differences.empty()) {
    ImGui::Text("dtype differences");
    if (ImGui::BeginTable("##dtypes", 4, ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY | ImGuiTableFlags_Resizable,
                          ImVec2(0, ImGui::GetContentRegionAvail().y))) {
      ImGui::TableSetupScrollFreeze(0, 1);
      ImGui::TableSetupColumn("module / op");
      ImGui::TableSetupColumn("a");
      ImGui::TableSetupColumn("b");
      ImGui::TableSetupColumn("rows");
      ImGui::TableHeadersRow();
      for (const auto& x : d->dtype_differences) {
        ImGui::TableNextRow();
        ImGui::TableSetColumnIndex(0);
        ImGui::Text("%s %s %s", std::string(trace::phase_name(x.phase)).c_str(), x.module.c_str(), x.op.c_str());
        ImGui::TableSetColumnIndex(1);
        ImGui::TextUnformatted(x.dtypes_a.c_str());
        ImGui::TableSetColumnIndex(2);
        ImGui::TextUnformatted(x.dtypes_b.c_str());
        ImGui::TableSetColumnIndex(3);
        ImGui::Text("%lld", static_cast<long long>(x.count));
      }
      ImGui::EndTable();
    }
  }
  ImGui::EndChild();
  ImGui::SameLine();
  ImGui::BeginChild("##compare_ops", ImVec2(0, 0), false);
  const StepData* da = s.a->step_data();
  const StepData* db = s.b->step_data();
  const std::int64_t step_a = s.a->selected_step().value_or(0);
  const std::int64_t step_b = paired_step_b(d, step_a);
  if (step_b == step_a) {
    ImGui::Text("ops of step %lld, a against b", static_cast<long long>(step_a));
  } else {
    ImGui::Text("ops of step %lld, a against b's step %lld (paired by optimizer update)", static_cast<long long>(step_a),
                static_cast<long long>(step_b));
  }
  if (db != nullptr && db->step != step_b) {
    s.b->select_step(step_b);  // the diff finished after the selection: b's paired step is another one
    db = nullptr;
  }
  if (!da || !db) {
    ImGui::TextDisabled(s.b->step_error().empty() ? "loading..." : s.b->step_error().c_str());
  } else {
    if (da->load_id != s.op_diffs_for_a || db->load_id != s.op_diffs_for_b) {
      // Backward rows hold values times each run's loss scale: divided out, as ampscope diff does.
      // b's rows carry b's own step number; diff_ops pairs rows of equal steps, so they take a's.
      std::vector<trace::OpRow> rows_b = db->ops;
      for (trace::OpRow& r : rows_b) r.step = step_a;
      s.op_diffs = analysis::diff_ops(da->ops, rows_b, {}, loss_scale_at(s.a->steps(), step_a),
                                      loss_scale_at(s.b->steps(), step_b));
      s.op_diffs_for_a = da->load_id;
      s.op_diffs_for_b = db->load_id;
    }
    if (ImGui::BeginTable("##op_diffs", 6, ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY | ImGuiTableFlags_ScrollX | ImGuiTableFlags_Resizable |
                                               ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingFixedFit,
                          ImVec2(0, ImGui::GetContentRegionAvail().y))) {
      ImGui::TableSetupScrollFreeze(0, 1);
      ImGui::TableSetupColumn("module / op");
      ImGui::TableSetupColumn("dtypes a");
      ImGui::TableSetupColumn("dtypes b");
      ImGui::TableSetupColumn("absmax a");
      ImGui::TableSetupColumn("absmax b");
      ImGui::TableSetupColumn("max rel diff");
      ImGui::TableHeadersRow();
      ImGuiListClipper clipper;
      clipper.Begin(static_cast<int>(s.op_diffs.size()));
      while (clipper.Step()) {
        for (int i = clipper.DisplayStart; i < clipper.DisplayEnd; ++i) {
          const auto& o = s.op_diffs[static_cast<std::size_t>(i)];
          ImGui::TableNextRow();
          ImGui::TableSetColumnIndex(0);
          ImGui::PushID(i);
          if (ImGui::Selectable(fmt::format("{} {} {}", trace::phase_name(o.key.phase), o.key.module, o.key.op).c_str(),
                                s.selected_seq && *s.selected_seq == o.seq_a, ImGuiSelectableFlags_SpanAllColumns)) {
            s.selected_seq = o.seq_a;
          }
          ImGui::PopID();
          ImGui::TableSetColumnIndex(1);
          ImGui::TextColored(to_vec4(o.dtype_differs ? colours::kWarning : dtype_colour("")), "%s", o.dtypes_a.c_str());
          ImGui::TableSetColumnIndex(2);
          ImGui::TextColored(to_vec4(o.dtype_differs ? colours::kWarning : dtype_colour("")), "%s", o.dtypes_b.c_str());
          ImGui::TableSetColumnIndex(3);
          ImGui::TextUnformatted(format_number(o.a.absmax).c_str());
          ImGui::TableSetColumnIndex(4);
          ImGui::TextUnformatted(format_number(o.b.absmax).c_str());
          ImGui::TableSetColumnIndex(5);
          if (o.nonfinite_differs) ImGui::TableSetBgColor(ImGuiTableBgTarget_CellBg, im(colours::kNonFiniteCell));
          const bool big = o.max_rel > d->options.threshold;
          ImGui::TextColored(big ? to_vec4(colours::kWarning) : ImVec4(0.8f, 0.8f, 0.8f, 1), "%s %s",
                             format_number(o.max_rel).c_str(), o.stat.c_str());
        }
      }
      ImGui::EndTable();
    }
  }
  ImGui::EndChild();
  ImGui::End();
}

namespace {

// The geometry of a heatmap (the Precision and FP8 panels): a column of row labels, a header of step
// numbers, rows x cols cells, in the current scrolling child. Made after BeginChild; it reserves the
// content's size and works out which cells are visible, so each frame draws a bounded number of them.
struct HeatmapGrid {
  HeatmapGrid(std::size_t rows_in, std::size_t cols_in, float label_max) : rows(rows_in), cols(cols_in) {
    const float line = ImGui::GetTextLineHeight();
    view = ImGui::GetWindowSize();
    label_w = std::clamp(view.x * 0.3f, 120.0f, label_max);
    header_h = line + 4;
    cell_w = std::clamp(std::floor((view.x - label_w - 16) / static_cast<float>(cols)), 6.0f, 28.0f);
    cell_h = std::floor(line + 2);
    origin = ImGui::GetCursorScreenPos();  // the content's top left, scrolled
    ImGui::Dummy(ImVec2(label_w + cell_w * static_cast<float>(cols), header_h + cell_h * static_cast<float>(rows)));
    win = ImGui::GetWindowPos();
    const float scroll_x = ImGui::GetScrollX(), scroll_y = ImGui::GetScrollY();
    r0 = static_cast<std::size_t>(std::max(0.0f, std::floor(scroll_y / cell_h)));
    r1 = std::min(rows, r0 + static_cast<std::size_t>(view.y / cell_h) + 2);
    c0 = static_cast<std::size_t>(std::max(0.0f, std::floor(scroll_x / cell_w)));
    c1 = std::min(cols, c0 + static_cast<std::size_t>((view.x - label_w) / cell_w) + 2);
    dl = ImGui::GetWindowDrawList();
  }

  ImVec2 cell_min(std::size_t r, std::size_t c) const {
    return ImVec2(std::floor(origin.x + label_w + cell_w * static_cast<float>(c)),
                  std::floor(origin.y + header_h + cell_h * static_cast<float>(r)));
  }
  void fill(std::size_t r, std::size_t c, ImU32 colour) const {
    const ImVec2 a = cell_min(r, c);
    dl->AddRectFilled(a, ImVec2(a.x + cell_w - 1, a.y + cell_h - 1), colour);
  }
  void outline(std::size_t r, std::size_t c) const {
    const ImVec2 a = cell_min(r, c);
    dl->AddRect(ImVec2(a.x - 1, a.y - 1), ImVec2(a.x + cell_w, a.y + cell_h), im(colours::kSelectedStep), 0, 0, 2);
  }

  // The labels stay at the left and the steps at the top while the cells scroll under them. `label(r)` gives
  // row r's text and whether it is highlighted; `step(c)` column c's step number.
  template <class Label, class Step>
  void draw_frame(const char* corner, const Label& label, const Step& step) const {
    const ImU32 bg = ImGui::GetColorU32(ImGuiCol_WindowBg);
    dl->AddRectFilled(ImVec2(win.x, origin.y + header_h), ImVec2(win.x + label_w - 2, win.y + view.y), bg);
    for (std::size_t r = r0; r < r1; ++r) {
      const ImVec2 a = cell_min(r, 0);
      const auto [text, hot] = label(r);
      dl->PushClipRect(ImVec2(win.x, a.y), ImVec2(win.x + label_w - 6, a.y + cell_h), true);
      dl->AddText(ImVec2(win.x + 4, a.y), hot ? im(colours::kSelectedStep) : ImGui::GetColorU32(ImGuiCol_Text),
                  text.c_str());
      dl->PopClipRect();
    }
    dl->AddRectFilled(ImVec2(win.x, win.y), ImVec2(win.x + view.x, win.y + header_h), bg);
    dl->AddText(ImVec2(win.x + 4, win.y + 2), ImGui::GetColorU32(ImGuiCol_TextDisabled), corner);
    const std::size_t every = static_cast<std::size_t>(std::ceil(ImGui::CalcTextSize("000000").x / cell_w));
    for (std::size_t c = c0 - c0 % every; c < c1; c += every) {
      const float x = cell_min(0, c).x;
      if (x < win.x + label_w) continue;
      dl->AddText(ImVec2(x, win.y + 2), ImGui::GetColorU32(ImGuiCol_TextDisabled), fmt::format("{}", step(c)).c_str());
    }
  }

  // Under the mouse (only while the child is hovered): the row, and the column when over a cell rather than
  // a label.
  struct Hit {
    std::optional<std::size_t> row, col;
  };
  Hit hit() const {
    Hit h;
    if (!ImGui::IsWindowHovered()) return h;
    const ImVec2 mouse = ImGui::GetIO().MousePos;
    const float fx = (mouse.x - origin.x - label_w) / cell_w, fy = (mouse.y - origin.y - header_h) / cell_h;
    if (mouse.y < win.y + header_h || fy < 0 || fy >= static_cast<float>(rows)) return h;
    h.row = static_cast<std::size_t>(fy);
    if (mouse.x >= win.x + label_w && fx >= 0 && fx < static_cast<float>(cols)) h.col = static_cast<std::size_t>(fx);
    return h;
  }

  std::size_t rows, cols;
  ImVec2 view, origin, win;
  float label_w = 0, header_h = 0, cell_w = 0, cell_h = 0;
  std::size_t r0 = 0, r1 = 0, c0 = 0, c1 = 0;
  ImDrawList* dl = nullptr;
};

}  // namespace

void draw_precision_panel(ViewerState& s) {
  if (!begin_panel("Precision", s.layout.precision)) return;
  if (!need_trace(s)) {
    ImGui::End();
    return;
  }
  const PrecisionMap* m = s.a->precision();
  if (!s.a->precision_error().empty()) {
    error_box(s.a->precision_error());
    ImGui::End();
    return;
  }
  if (!m || m->rows.empty()) {
    ImGui::PushTextWrapPos(0.0f);
    if (s.a->precision_loading()) {
      ImGui::TextDisabled("reading the f32 twin's rows...");
    } else {
      ImGui::TextDisabled("This trace has no precision rows: the f32 twin was not run. Train with "
                          "`ampscope train --twin` (or --twin-every N) to record how many bits of each op agree "
                          "with f32.");
    }
    ImGui::PopTextWrapPos();
    ImGui::End();
    return;
  }
  // The toggles and the legend.
  ImGui::Checkbox("backward", &s.precision_backward);
  help_marker("Forward (default): the ops of the forward pass. Backward: the autograd nodes whose backward ran in "
              "f16/bf16, each computed again in f32 on its own inputs: local error only (both colourings show it), "
              "ranked as the report's backward list (the largest local error first).");
  ImGui::SameLine();
  ImGui::Checkbox("local", &s.precision_local);
  help_marker("Colour: bits of agreement with the f32 twin. Accumulated (default): -log2 of the op's max relative "
              "error against the twin's value, with every earlier op's error in it. Local: what this op's own "
              "rounding costs, on its own inputs (none for an op that ran in f32: grey). Rows are ops, ranked as "
              "the report's PRECISION section ranks them (the largest jump in error first); columns are steps. "
              "Hover a cell for its numbers, click it to show the op in Op detail.");
  ImGui::SameLine();
  ImGui::TextDisabled("bits:");
  for (const LegendTick& t : bits_legend()) {
    ImGui::SameLine();
    swatch(t.colour, 0);
    ImGui::TextUnformatted(t.label.c_str());
  }
  ImGui::SameLine();
  swatch(kNoBits, 0);
  ImGui::TextUnformatted("no local (f32 op)");
  // The rows of the phase shown: forward rows come first in the map, backward rows after them.
  const std::size_t base = s.precision_backward ? m->backward_begin : 0;
  const std::size_t rows = s.precision_backward ? m->rows.size() - m->backward_begin : m->backward_begin;
  ImGui::SameLine();
  ImGui::TextDisabled("  %s %s x %s steps", format_count(static_cast<std::int64_t>(rows)).c_str(),
                      s.precision_backward ? "backward nodes" : "ops",
                      format_count(static_cast<std::int64_t>(m->steps.size())).c_str());
  if (rows == 0) {
    ImGui::TextDisabled(s.precision_backward ? "No backward rows: a trace of format_version 5, or a run whose backward "
                                               "ran in f32."
                                             : "No forward rows.");
    ImGui::End();
    return;
  }

  // The grid, in a child that scrolls both ways; only the visible cells are drawn (bounded work per frame).
  ImGui::BeginChild("##heatmap", ImVec2(0, 0), false, ImGuiWindowFlags_HorizontalScrollbar);
  const HeatmapGrid g(rows, m->steps.size(), 320.0f);
  const std::optional<std::int64_t> sel_step = s.a->selected_step();
  for (std::size_t r = g.r0; r < g.r1; ++r) {
    for (std::size_t c = g.c0; c < g.c1; ++c) {
      const trace::PrecisionRow* p = m->at(base + r, c);
      if (!p) continue;
      g.fill(r, c, im(bits_colour(s.precision_local ? local_bits(*p) : accumulated_bits(*p))));
      if (sel_step && s.selected_seq && p->step == *sel_step && p->seq == *s.selected_seq) g.outline(r, c);
    }
  }
  g.draw_frame(
      "op \\ step",
      [&](std::size_t r) {
        return std::pair<const std::string&, bool>(m->rows[base + r].label,
                                                    s.precision_hover_row && *s.precision_hover_row == r);
      },
      [&](std::size_t c) { return m->steps[c]; });
  // Hover: the cell's numbers; click: the op in Op detail.
  s.precision_hover_row.reset();
  if (const HeatmapGrid::Hit hit = g.hit(); hit.row) {
    const std::size_t r = *hit.row;
    s.precision_hover_row = r;
    if (hit.col) {
      if (const trace::PrecisionRow* p = m->at(base + r, *hit.col)) {
        ImGui::BeginTooltip();
        ImGui::TextUnformatted(precision_cell_text(m->rows[base + r], *p).c_str());
        ImGui::EndTooltip();
        if (ImGui::IsMouseClicked(0)) {
          select_step(s, p->step, p->seq);
          s.scroll_to_selected = true;
        }
      }
    } else {
      ImGui::SetTooltip("%s", m->rows[base + r].label.c_str());
    }
  }
  ImGui::EndChild();
  ImGui::End();
}

// Op detail's precision part: the twin's numbers, and the error histogram (flip, buckets of bits, exact).
void draw_error_histogram(ViewerState& s, const trace::PrecisionRow& p, float height) {
  ImGui::Text("error histogram against the %s twin (%s values, %s)", analysis::reference_of(p).c_str(),
              format_count(p.numel).c_str(), p.phase == trace::Phase::backward ? "local" : "accumulated");
  help_marker("Each element of the output, counted once: flipped (0, inf or saturated where the twin is not), "
              "in the bucket of its bits of agreement (floor(-log2 relative error): bucket 0 is an error above "
              "1/2, 25+ one of 2^-25 or less), or exact. Colours as the Precision panel's scale.");
  const std::vector<Bar> bars = error_histogram_bars(p);
  std::vector<double> x, y;
  std::vector<ImU32> bar_colours;
  plot::State& st = s.error_plot;
  st.x = {.scale = plot::Scale::linear, .min = 0, .max = static_cast<double>(bars.size()), .fit = false,
          .label = "bits of agreement (floor(-log2 relative error))"};
  st.x.labels.clear();
  for (std::size_t i = 0; i < bars.size(); ++i) {
    x.push_back(static_cast<double>(i) + 0.15);
    y.push_back(bars[i].count);
    bar_colours.push_back(im(bars[i].colour));
    // flip, every fifth bucket and exact: labels that do not overlap.
    const bool shown = i == 0 || i + 1 == bars.size() || (i >= 1 && i <= 21 && (i - 1) % 5 == 0);
    if (shown) st.x.labels.push_back({static_cast<double>(i) + 0.5, bars[i].label});
  }
  const std::pair<std::int64_t, std::int64_t> key{p.step, p.seq};
  if (s.error_plot_for != key) {
    s.error_plot_for = key;
    st.y.fit = true;
  }
  st.y.scale = plot::Scale::log10;
  st.y.fit_also = {1.0};
  st.y.label = "values";
  st.legend = false;
  plot::Series series{.label = "values", .x = x, .y = y, .colour = im(colours::kHistogramBar),
                      .style = plot::Style::bars, .bar_width = 0.7, .bar_colours = bar_colours};
  plot::draw("##error_hist", st, {&series, 1}, {}, ImVec2(0, height));
}

namespace {

// The measure switch the FP8 and Blocks panels share: underflow or saturation, the panel's help beside it, then
// the fraction colours' legend.
void fraction_measure_switch(Fp8Measure& measure, std::string_view help) {
  int picked = measure == Fp8Measure::underflow ? 0 : 1;
  ImGui::RadioButton("underflow", &picked, 0);
  ImGui::SameLine();
  ImGui::RadioButton("saturation", &picked, 1);
  measure = picked == 0 ? Fp8Measure::underflow : Fp8Measure::saturation;
  help_marker(help);
  ImGui::SameLine();
  ImGui::TextDisabled("fraction:");
  for (const FractionTick& t : fraction_legend()) {
    ImGui::SameLine();
    swatch(t.colour, 0);
    ImGui::TextUnformatted(t.label.c_str());
  }
}

// The grid the FP8 and Blocks panels share, in a scrolling child `child_id` that leaves `below` pixels under it:
// each cell the fraction `measure` of map row r at step column c (no row: the background shows), the picked row's
// cell at the selected step outlined. Hovering a cell shows cell_text(row, cell); a click on it selects its step and
// module (select(s, r, step)); on a row's label, that row becomes the picked one. Map is Fp8Map or BlockMap.
template <class Map, class CellText, class Select>
void draw_fraction_grid(ViewerState& s, const Map& m, Fp8Measure measure, std::size_t picked,
                        std::optional<std::int64_t> sel_step, const char* child_id, float below, float label_max,
                        const char* corner, std::optional<std::size_t>& hover_row,
                        std::optional<std::size_t>& picked_row, CellText cell_text, Select select) {
  ImGui::BeginChild(child_id, ImVec2(0, -below), false, ImGuiWindowFlags_HorizontalScrollbar);
  const HeatmapGrid g(m.rows.size(), m.steps.size(), label_max);
  for (std::size_t r = g.r0; r < g.r1; ++r) {
    for (std::size_t c = g.c0; c < g.c1; ++c) {
      const double f = m.fraction(r, c, measure);
      if (std::isnan(f)) continue;  // no row: the background shows
      g.fill(r, c, im(fraction_colour(f)));
      if (sel_step && m.steps[c] == *sel_step && r == picked) g.outline(r, c);
    }
  }
  g.draw_frame(
      corner,
      [&](std::size_t r) {
        return std::pair<const std::string&, bool>(m.rows[r].label, (hover_row && *hover_row == r) || r == picked);
      },
      [&](std::size_t c) { return m.steps[c]; });
  hover_row.reset();
  if (const HeatmapGrid::Hit hit = g.hit(); hit.row) {
    const std::size_t r = *hit.row;
    hover_row = r;
    if (hit.col) {
      if (const auto* p = m.at(r, *hit.col)) {
        ImGui::BeginTooltip();
        ImGui::TextUnformatted(cell_text(m.rows[r], *p).c_str());
        ImGui::EndTooltip();
        if (ImGui::IsMouseClicked(0)) {
          s.user_selected = true;
          select(s, r, p->step);
        }
      }
    } else {
      ImGui::SetTooltip("%s", m.rows[r].label.c_str());
      if (ImGui::IsMouseClicked(0)) picked_row = r;  // a label: pick that row, keep the step
    }
  }
  ImGui::EndChild();
}

}  // namespace

// FP8: the underflow (or saturation) fraction of each operand (rows) at each recorded step (columns), and below
// it the picked operand's scale and amax over the steps. A click on a cell selects its step and module.
void draw_fp8_panel(ViewerState& s) {
  if (!begin_panel("FP8", s.layout.fp8)) return;
  if (!need_trace(s)) {
    ImGui::End();
    return;
  }
  if (!s.a->fp8_error().empty()) {
    error_box(s.a->fp8_error());
    ImGui::End();
    return;
  }
  const Fp8Map* m = s.a->fp8();
  if (!m || m->rows.empty()) {
    ImGui::TextDisabled(s.a->fp8_loading() ? "reading the FP8 rows..." : "This trace has no FP8 rows.");
    ImGui::End();
    return;
  }
  fraction_measure_switch(
      s.fp8_measure,
      "Each cell: of the operand's nonzero values at that step, the fraction the cast quantized to zero "
      "(underflow) or clipped at the format's max (saturation, silent: no NaN shows it). Rows are the FP8 "
      "Linears' operands, columns the recorded steps. Hover a cell for its numbers; click it to select the "
      "step, show that Linear's ops and plot the operand's scale and amax below.");
  const std::size_t rows = m->rows.size();
  const std::size_t picked = s.fp8_row && *s.fp8_row < rows ? *s.fp8_row : 0;

  const float plot_h = std::max(120.0f, std::floor(ImGui::GetContentRegionAvail().y * 0.4f));
  const std::optional<std::int64_t> sel_step = s.a->selected_step();
  draw_fraction_grid(s, *m, s.fp8_measure, picked, sel_step, "##fp8map", plot_h, 300.0f, "operand \\ step",
                     s.fp8_hover_row, s.fp8_row, fp8_cell_text, select_fp8_cell);

  // The picked operand's scale and amax (and the history's amax that sets the next scale) over the steps.
  const Fp8OperandSeries series = fp8_operand_series(*m, picked);
  if (s.fp8_plot_for != picked) {
    s.fp8_plot = {};
    s.fp8_plot.y.scale = plot::Scale::log2;
    s.fp8_plot.x.integer = true;
    s.fp8_plot.empty_note = "no finite positive scale or amax to draw";
    s.fp8_plot_for = picked;
  }
  // The operand's numbers at the selected step, folded by default so the plot keeps its room.
  const auto column = sel_step ? fp8_column(*m, *sel_step) : std::nullopt;
  const trace::Fp8Row* shown = column ? m->at(picked, *column) : nullptr;
  if (!shown) {
    ImGui::TextUnformatted(m->rows[picked].label.c_str());
  } else if (ImGui::TreeNode("##fp8numbers", "%s, step %lld: scale %s, amax %s", m->rows[picked].label.c_str(),
                             static_cast<long long>(shown->step), format_number(shown->scale).c_str(),
                             format_number(shown->amax).c_str())) {
    key_value_table("##fp8detail", fp8_detail_rows(*shown), 110);
    ImGui::TreePop();
  }
  std::vector<plot::Series> lines{
      {.label = "scale", .x = series.step, .y = series.scale, .colour = im(colours::kScale), .style = plot::Style::line_and_markers},
      {.label = "amax", .x = series.step, .y = series.amax, .colour = im(colours::kLoss), .style = plot::Style::line_and_markers},
      {.label = "history amax", .x = series.step, .y = series.history_amax, .colour = im(colours::kGradNorm)}};
  std::vector<plot::Marker> markers;
  if (sel_step) markers.push_back({static_cast<double>(*sel_step), im(colours::kSelectedStep), "selected"});
  const plot::Result r = plot::draw("##fp8plot", s.fp8_plot, lines, markers, ImVec2(-1, -1));
  if (r.clicked && !series.step.empty()) {
    // The recorded step nearest the click.
    const auto it = std::min_element(series.step.begin(), series.step.end(), [&](double a, double b) {
      return std::fabs(a - r.clicked_x) < std::fabs(b - r.clicked_x);
    });
    s.user_selected = true;
    select_step(s, static_cast<std::int64_t>(*it));
  }
  ImGui::End();
}

// Blocks: the underflow (or saturation) fraction of each block-scaled operand copy (rows, what-if copies labelled
// so) at each recorded step (columns), the FP8 panel's grid and colours; below it the picked copy's numbers at the
// selected step (the widest block and the one that lost most, where they lie). A click on a cell selects its step
// and module.
void draw_blocks_panel(ViewerState& s) {
  if (!begin_panel("Blocks", s.layout.blocks)) return;
  if (!need_trace(s)) {
    ImGui::End();
    return;
  }
  if (!s.a->blocks_error().empty()) {
    error_box(s.a->blocks_error());
    ImGui::End();
    return;
  }
  const BlockMap* m = s.a->blocks();
  if (!m || m->rows.empty()) {
    ImGui::TextDisabled(s.a->blocks_loading() ? "reading the block-scaled rows..." : "This trace has no block-scaled rows.");
    ImGui::End();
    return;
  }
  fraction_measure_switch(
      s.blocks_measure,
      "Each cell: of the copy's nonzero values at that step, the fraction its block's scale lost to zero "
      "(underflow) or clipped at the element's max (saturation). Rows are the operand copies (rowwise, "
      "columnwise) of the block-scaled Linears; 'what-if' rows were measured only (--what-if), the run did "
      "not train in that format. Hover a cell for its numbers; click it to select the step and show that "
      "Linear's ops.");
  const std::size_t rows = m->rows.size();
  const std::size_t picked = s.blocks_row && *s.blocks_row < rows ? *s.blocks_row : 0;
  const float detail_h = std::max(120.0f, std::floor(ImGui::GetContentRegionAvail().y * 0.35f));
  const std::optional<std::int64_t> sel_step = s.a->selected_step();
  draw_fraction_grid(s, *m, s.blocks_measure, picked, sel_step, "##blocksmap", detail_h, 320.0f, "copy \\ step",
                     s.blocks_hover_row, s.blocks_row, block_cell_text, select_block_cell);
  // The picked copy at the selected step (or its last recorded step).
  std::optional<std::size_t> column;
  if (sel_step) {
    const auto it = std::lower_bound(m->steps.begin(), m->steps.end(), *sel_step);
    if (it != m->steps.end() && *it == *sel_step) column = static_cast<std::size_t>(it - m->steps.begin());
  }
  const trace::BlockRow* shown = column ? m->at(picked, *column) : nullptr;
  if (!shown) {
    ImGui::TextUnformatted(m->rows[picked].label.c_str());
    ImGui::TextDisabled("no row at the selected step: click a cell");
  } else {
    key_value_table("##blocksdetail", block_detail_rows(*shown), 110);
  }
  ImGui::End();
}

void draw_file_browser(ViewerState& s) {
  if (!s.browser_open) return;
  const ImVec2 vp = ImGui::GetMainViewport()->WorkSize;
  ImGui::SetNextWindowSize(ImVec2(std::min(640.0f, vp.x - 40), std::min(480.0f, vp.y - 40)), ImGuiCond_Appearing);
  ImGui::SetNextWindowPos(ImVec2(vp.x * 0.5f, vp.y * 0.5f), ImGuiCond_Appearing, ImVec2(0.5f, 0.5f));
  if (!ImGui::Begin(s.browser_for_b ? "Open a trace to compare (b)" : "Open a trace", &s.browser_open,
                    ImGuiWindowFlags_NoCollapse | ImGuiWindowFlags_NoSavedSettings)) {
    ImGui::End();
    return;
  }
  namespace fs = std::filesystem;
  if (s.browser_dir.empty()) {
    std::error_code ec;
    s.browser_dir = fs::current_path(ec);
    s.browser_dirty = true;
  }
  if (s.browser_dirty) {
    s.browser_entries = list_directory(s.browser_dir, &s.browser_error);
    std::snprintf(s.browser_path, sizeof s.browser_path, "%s", s.browser_dir.string().c_str());
    s.browser_dirty = false;
  }
  ImGui::SetNextItemWidth(-60);
  if (ImGui::InputText("##path", s.browser_path, sizeof s.browser_path, ImGuiInputTextFlags_EnterReturnsTrue)) {
    const fs::path p = s.browser_path;
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      s.browser_dir = p;
      s.browser_dirty = true;
    } else {
      // As a: a rank's file opens its run's ranks (open_paths); as b: the file alone.
      if (s.browser_for_b) open_trace(s, p, true); else open_paths(s, {p.string()});
      s.browser_open = false;
    }
  }
  ImGui::SameLine();
  if (ImGui::Button("up")) {
    s.browser_dir = s.browser_dir.parent_path();
    s.browser_dirty = true;
  }
  if (!s.browser_error.empty()) error_box(s.browser_error);
  ImGui::TextDisabled("folders and .h5 files; click a file to open it");
  ImGui::BeginChild("##entries", ImVec2(0, 0), true);
  for (const auto& e : s.browser_entries) {
    const std::string label = e.directory ? "[dir]  " + e.name : fmt::format("       {}  ({} KiB)", e.name, e.size / 1024);
    if (ImGui::Selectable(label.c_str())) {
      if (e.directory) {
        s.browser_dir = e.name == ".." ? s.browser_dir.parent_path() : s.browser_dir / e.name;
        s.browser_dirty = true;
      } else {
        if (s.browser_for_b) open_trace(s, s.browser_dir / e.name, true); else open_paths(s, {(s.browser_dir / e.name).string()});
        s.browser_open = false;
      }
    }
  }
  ImGui::EndChild();
  ImGui::End();
}

void draw_menu_bar(ViewerState& s) {
  if (!ImGui::BeginMainMenuBar()) return;
  if (ImGui::BeginMenu("File")) {
    if (ImGui::MenuItem("Open...")) {
      s.browser_open = true;
      s.browser_for_b = false;
      s.browser_dirty = true;
    }
    if (ImGui::MenuItem("Open to compare (b)...", nullptr, false, s.a != nullptr)) {
      s.browser_open = true;
      s.browser_for_b = true;
      s.browser_dirty = true;
    }
    if (ImGui::MenuItem("Close b", nullptr, false, s.b != nullptr)) {
      s.comparison.reset();
      s.b.reset();
      s.show_compare = false;
    }
    ImGui::EndMenu();
  }
  if (ImGui::BeginMenu("View")) {
    if (ImGui::MenuItem("Op detail", nullptr, !s.show_compare)) s.show_compare = false;
    if (ImGui::MenuItem("Compare", nullptr, s.show_compare)) s.show_compare = true;
    ImGui::Separator();
    if (ImGui::MenuItem("Scale and loss", nullptr, !s.show_precision && !s.show_fp8 && !s.show_blocks)) {
      s.show_precision = s.show_fp8 = s.show_blocks = false;
    }
    if (ImGui::MenuItem("Precision", nullptr, s.show_precision && !s.show_fp8 && !s.show_blocks)) {
      s.show_precision = true, s.show_fp8 = s.show_blocks = false;
    }
    // Only for an FP8 run's trace: no other trace has the panel.
    if (s.a && s.a->ok() && has_fp8_panel(s.a->counts()) && ImGui::MenuItem("FP8", nullptr, s.show_fp8 && !s.show_blocks)) s.show_fp8 = true, s.show_blocks = false;
    // Only for a trace with /blocks rows (block-scaled formats, --what-if).
    if (s.a && s.a->ok() && has_blocks_panel(s.a->counts()) && ImGui::MenuItem("Blocks", nullptr, s.show_blocks)) {
      s.show_blocks = true;
    }
    ImGui::EndMenu();
  }
  if (s.a) {
    ImGui::TextDisabled("%s", s.a->path().filename().string().c_str());
    if (s.b) ImGui::TextDisabled("vs %s", s.b->path().filename().string().c_str());
    if (s.a->live()) ImGui::TextColored(to_vec4(colours::kWarning), "LIVE");
    if (s.a->analysing()) ImGui::TextDisabled("analysing... %.0f%%", 100.0 * s.a->analysis_progress());
  }
  ImGui::EndMainMenuBar();
}

}  // namespace ampscope::viewer
