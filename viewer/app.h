// viewer/app.h: ampscope-view's window: all UI state in one struct (ViewerState), one function per panel
// (draw_xxx_panel), a frame that is a flat list of panels, and the program (run_viewer: the GLFW window,
// the frame loop, headless screenshots). What the panels show comes from viewer/view_model.h and
// viewer/document.h; this layer only draws it.
//
//   ViewerOptions o = parse_options(args);
//   return run_viewer(o);   // exit status: 0, or 2 when there is no display
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "viewer/document.h"
#include "viewer/options.h"
#include "viewer/plot.h"
#include "viewer/view_model.h"

namespace ampscope::viewer {

// Where each panel's window goes this frame (computed by draw_frame); a panel not visible is not drawn.
struct PanelRect {
  float x = 0, y = 0, w = 0, h = 0;
  bool visible = false;
};
struct Layout {
  PanelRect errors, overview, scale, ops, detail, why, compare, precision, fp8, blocks;
};

struct ViewerState {
  // Traces: a (the one the panels show) and b (compared against a), either may be null.
  std::unique_ptr<TraceDocument> a, b;
  std::unique_ptr<Comparison> comparison;
  std::vector<std::string> errors;  // files that could not be opened, with the reason; shown on top

  // A data-parallel run's rank traces (view_model.h, OpenPlan): one document per rank, in rank order. The
  // rank shown is `a` (every panel shows a); its slot here is empty while it is shown, the others wait here
  // (their steps are read, their analysis starts when they are first shown). Empty when no rank set is open.
  struct RankSlot {
    int rank = 0;
    std::unique_ptr<TraceDocument> doc;  // null for the shown rank (it is `a`)
  };
  std::vector<RankSlot> ranks;
  std::size_t rank_shown = 0;           // the index in `ranks` of the rank `a` is
  std::optional<int> wanted_rank;       // --rank
  std::vector<RankLine> rank_lines;     // the overlays, computed again when a rank's steps change
  std::vector<std::size_t> rank_lines_steps;  // each rank's step count they were computed from

  // Selection. The step lives in the document (it loads that step's rows); the op is its seq.
  std::optional<std::int64_t> selected_seq;
  bool user_selected = false;      // the user picked a step: do not jump to the first anomaly later
  bool jumped_to_anomaly = false;  // the selection moved to the first anomaly once the analysis ended
  std::optional<std::int64_t> wanted_step, wanted_seq;  // --step / --seq
  // The early anomaly (document.h, early_anomaly) is selected, labelled provisional, until the analysis ends: then the
  // selection stays (the analysis agrees) or moves to the analysis's first anomaly, and anomaly_note says why.
  bool early_shown = false;
  std::uint64_t early_op_for = 0;  // StepData::load_id whose rows picked the early anomaly's op
  std::string anomaly_note;        // why the selection moved when the analysis ended; cleared by the user's pick
  bool headless = false;           // select nothing until the analysis (or the trace's early anomaly) says where
  bool scroll_to_selected = false; // the ops table brings the selected row into view once

  // Ops table.
  char filter_text[128] = "";
  OpFilter filter;
  OpColumn sort_column = OpColumn::seq;
  bool sort_ascending = true;
  std::vector<std::uint32_t> op_rows;  // filtered and sorted indices into the step's ops
  std::uint64_t op_rows_for = 0;  // StepData::load_id of the rows op_rows indexes
  bool op_rows_dirty = true;
  float op_row_height = 0;

  // Plots: the scale, loss and gradient-norm plots share their x axis.
  plot::State scale_plot, loss_plot, norm_plot, histogram_plot, compare_plot;
  plot::State histogram_special;  // the subnormal, zero, inf and NaN bars beside the histogram (its y is histogram_plot's)
  plot::Axis shared_x;
  std::optional<std::int64_t> histogram_seq;  // the op whose histogram set the histogram plot's x range
  std::uint64_t histogram_load = 0;
  StepSeries series;
  std::size_t series_steps = static_cast<std::size_t>(-1);

  // Op detail: the selected op's inputs and consumers, computed again when the op or the step's rows change.
  std::vector<OpLink> detail_producers, detail_consumers;
  std::optional<std::int64_t> detail_links_seq;
  std::uint64_t detail_links_load = 0;  // StepData::load_id of the rows they were computed from

  // Precision: the heatmap's colour (accumulated or local bits), and Op detail's error histogram.
  bool precision_local = false;
  bool precision_backward = false;  // the Precision panel shows the backward rows (autograd nodes) instead
  bool show_precision = false;  // the upper-right area shows Precision instead of Scale and loss
  std::optional<std::size_t> precision_hover_row;  // the heatmap row under the mouse last frame (highlighted)
  plot::State error_plot;
  std::optional<std::pair<std::int64_t, std::int64_t>> error_plot_for;  // (step, seq) the plot was fitted to

  // FP8 (a --precision fp8 trace only): the heatmap's measure, the operand whose scale and amax the plot shows (a
  // row of the document's Fp8Map, picked by a click on a cell), and the plot.
  bool show_fp8 = false;  // the upper-right area shows FP8 instead of Scale and loss (when trace a has /fp8 rows)
  Fp8Measure fp8_measure = Fp8Measure::underflow;
  std::optional<std::size_t> fp8_row;           // the operand plotted (nullopt: the map's first row)
  std::optional<std::size_t> fp8_hover_row;     // the heatmap row under the mouse last frame (highlighted)
  plot::State fp8_plot;
  std::optional<std::size_t> fp8_plot_for;      // the row the plot was fitted to

  // Blocks (a trace with /blocks rows only): the heatmap's measure (the FP8 panel's two), the copy whose numbers
  // show below it (a row of the document's BlockMap, picked by a click), the row under the mouse last frame.
  bool show_blocks = false;  // the upper-right area shows Blocks (when trace a has /blocks rows)
  Fp8Measure blocks_measure = Fp8Measure::underflow;
  std::optional<std::size_t> blocks_row;
  std::optional<std::size_t> blocks_hover_row;

  // Compare: the per-op differences of the selected step.
  std::vector<analysis::OpDiff> op_diffs;
  std::uint64_t op_diffs_for_a = 0, op_diffs_for_b = 0;  // StepData::load_id

  // File browser.
  bool browser_open = false;
  bool browser_for_b = false;
  std::filesystem::path browser_dir;
  char browser_path[512] = "";
  std::vector<DirEntry> browser_entries;
  std::string browser_error;
  bool browser_dirty = true;

  // Files dropped onto the window since the last frame (GLFW callback).
  std::vector<std::string> dropped;
  bool compare_hovered = false;

  // Layout: "all" places every panel; any other name fills the window with that panel (--panel).
  std::string panel = "all";
  bool show_compare = false;  // the lower-right area shows Compare instead of Op detail
  Layout layout;

  // Benchmark: scroll the ops table by this many pixels a frame.
  float bench_scroll_pixels = 0;
  bool ops_table_drawn = false;  // the table drew rows this frame
};

// Opening and selecting (the panels and the drop callback call these).
void open_trace(ViewerState& s, const std::filesystem::path& path, bool as_b);
// Opens what the names say (open_plan): a data-parallel run's rank traces, or trace a and b.
void open_paths(ViewerState& s, const std::vector<std::string>& names);
// Opens a run's rank traces together and shows ranks[shown]. Each must be a rank of the same run (its config's
// rank and world_size; probes/analysis/ranks.h, same_run), once; otherwise the error box says why and only the
// first trace is opened, alone. Closes trace b.
void open_ranks(ViewerState& s, const std::vector<std::string>& paths, std::size_t shown = 0);
// Shows rank `rank` of the open rank set (its ops, anomalies, op detail; the selected step and op stay). False
// when no open rank has that number.
bool select_rank(ViewerState& s, int rank);
// The document of the i-th rank of the open set (the shown one is `a`).
const TraceDocument* rank_document(const ViewerState& s, std::size_t i);
void select_step(ViewerState& s, std::int64_t step, std::optional<std::int64_t> seq = std::nullopt);
// Selects an op of the step shown (an input or consumer clicked in Op detail): the ops table scrolls to it.
void select_op(ViewerState& s, std::int64_t seq);
// A cell of the FP8 heatmap picked (a click): selects its step, plots its operand, and filters the ops table to its
// module, so the ops table shows that Linear's ops of that step.
void select_fp8_cell(ViewerState& s, std::size_t row, std::int64_t step);
// Whether the FP8 panel is placed this frame: trace a holds /fp8 rows (has_fp8_panel) and the panel was asked for
// (--panel fp8, or View > FP8 in the whole window). A trace without them never shows it.
bool fp8_panel_wanted(const ViewerState& s);
// A cell of the Blocks heatmap picked: selects its step and copy and filters the ops table to its module.
void select_block_cell(ViewerState& s, std::size_t row, std::int64_t step);
// Whether the Blocks panel is placed this frame: trace a holds /blocks rows (has_blocks_panel) and the panel was
// asked for (--panel blocks, or View > Blocks in the whole window).
bool blocks_panel_wanted(const ViewerState& s);
void poll_documents(ViewerState& s);
// True when nothing is loading or being analysed (headless mode waits for this).
bool idle(const ViewerState& s);

// The frame, and each panel. Each panel opens its own window at the position and size given.
void draw_frame(ViewerState& s);
void draw_errors(ViewerState& s);
void draw_overview_panel(ViewerState& s);
void draw_scale_panel(ViewerState& s);
void draw_ops_panel(ViewerState& s);
void draw_detail_panel(ViewerState& s);
void draw_why_panel(ViewerState& s);
void draw_compare_panel(ViewerState& s);
void draw_precision_panel(ViewerState& s);
void draw_fp8_panel(ViewerState& s);
void draw_blocks_panel(ViewerState& s);
void draw_file_browser(ViewerState& s);
void draw_menu_bar(ViewerState& s);

// The program: 0 on success, 1 on an error (a screenshot that could not be written), 2 without a display.
int run_viewer(const ViewerOptions& options);

}  // namespace ampscope::viewer
