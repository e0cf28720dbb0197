// ampscope-view's first anomaly at open, without a window (issue 37): a ViewerState selects the first anomaly the
// trace's /events and /steps name (TraceDocument::early_anomaly) before the analysis ends, labelled provisional; the
// analysis's verdict then keeps it (same step) or moves the selection and says why; the user's step (a click,
// --step) and op keep precedence; hostile traces (no anomaly event, an event of a step without rows, an event naming
// an op the step does not hold, /events removed) fall back to what the viewer did before. The traces are written with
// the real TraceWriter (viewer_fixtures.h, write_early_fixture); what the analysis finds in each is checked too, as
// the premise of the test, against where the fixture planted it.
#include <gtest/gtest.h>

#include <hdf5.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tests/viewer/viewer_fixtures.h"
#include "viewer/app.h"
#include "viewer/document.h"
#include "viewer/view_model.h"

namespace ampscope::viewer {
namespace {

using testing::EarlyFixture;
using testing::write_early_fixture;

std::filesystem::path fixture(const std::string& name, const EarlyFixture& f) {
  return write_early_fixture(testing::fixture_dir() / (name + ".h5"), f);
}

// Trace a opened without its analysis (as a rank not shown yet), so the test sees the state before the analysis
// has run, whatever the machine's speed; enable_analysis() starts it.
void open_unanalysed(ViewerState& s, const std::filesystem::path& path) {
  TraceDocument::Options o;
  o.analyse = false;
  s.a = TraceDocument::open(path, o);
  ASSERT_TRUE(s.a->ok()) << s.a->error();
}

// Polls as the frame loop does until `done` (at most 20 s).
void poll_until(ViewerState& s, const std::function<bool()>& done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (poll_documents(s); !done() && std::chrono::steady_clock::now() < until; poll_documents(s))
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
}
void settle(ViewerState& s) {
  poll_until(s, [&] { return idle(s) && s.a->report() != nullptr; });
}
bool rows_in(const ViewerState& s) { return s.a->step_data() != nullptr; }

TEST(early_anomaly_view, the_origin_event_is_shown_provisionally_and_the_analysis_agreeing_drops_the_label) {
  ViewerState s;
  open_unanalysed(s, fixture("agree", {.origin_step = 3, .extra = {}}));
  const auto& early = s.a->early_anomaly();
  ASSERT_TRUE(early.has_value());
  EXPECT_EQ(early->step, 3);
  EXPECT_EQ(early->seq, 1);
  EXPECT_TRUE(early->from_events);
  EXPECT_EQ(early->what, "NaN/inf created by linear in fc2");
  s.headless = true;  // a screenshot run shows it too
  poll_until(s, [&] { return rows_in(s); });
  EXPECT_EQ(s.a->selected_step(), 3);
  EXPECT_EQ(s.selected_seq, 1);
  EXPECT_TRUE(s.early_shown);
  EXPECT_FALSE(s.user_selected);
  EXPECT_EQ(s.a->report(), nullptr) << "shown before any analysis";
  s.a->enable_analysis();
  settle(s);
  ASSERT_NE(s.a->report(), nullptr);
  ASSERT_FALSE(s.a->report()->anomalies.empty());
  EXPECT_EQ(s.a->report()->anomalies.front().step, 3) << "premise: the analysis finds the planted origin";
  EXPECT_EQ(s.a->selected_step(), 3);
  EXPECT_EQ(s.selected_seq, s.a->report()->anomalies.front().seq);
  EXPECT_FALSE(s.early_shown) << "the label goes";
  EXPECT_EQ(s.anomaly_note, "") << "nothing moved: nothing to explain";
}

TEST(early_anomaly_view, an_earlier_skipped_step_gives_way_to_the_analysiss_first_anomaly_with_a_note) {
  ViewerState s;
  open_unanalysed(s, fixture("disagree", {.origin_step = 4, .skipped_step = 1, .extra = {}}));
  ASSERT_TRUE(s.a->early_anomaly().has_value());
  EXPECT_EQ(s.a->early_anomaly()->step, 1);
  EXPECT_EQ(s.a->early_anomaly()->what, "gradient of fc1.weight held inf/NaN") << "the grad_overflow before skipped_step";
  EXPECT_FALSE(s.a->early_anomaly()->seq.has_value());
  poll_until(s, [&] { return rows_in(s); });
  EXPECT_EQ(s.a->selected_step(), 1);
  EXPECT_EQ(s.selected_seq, std::nullopt) << "step 1's rows hold no origin";
  EXPECT_TRUE(s.early_shown);
  s.a->enable_analysis();
  settle(s);
  ASSERT_NE(s.a->report(), nullptr);
  ASSERT_FALSE(s.a->report()->anomalies.empty());
  const analysis::Diagnosis& d = s.a->report()->anomalies.front();
  ASSERT_EQ(d.step, 4) << "premise: the backward overflow of step 1 is the scaler's, the origin of step 4 the anomaly";
  EXPECT_EQ(s.a->selected_step(), 4);
  EXPECT_EQ(s.selected_seq, d.seq);
  EXPECT_FALSE(s.early_shown);
  EXPECT_EQ(s.anomaly_note, "Moved to step 4, the analysis's first anomaly (" + d.cause +
                                ", linear in fc2): step 1 (gradient of fc1.weight held inf/NaN, from the trace's events), "
                                "shown until then, is not.");
}

TEST(early_anomaly_view, when_the_analysis_finds_no_anomaly_the_first_step_is_shown_and_the_note_says_why) {
  ViewerState s;
  open_unanalysed(s, fixture("none", {.skipped_step = 2, .extra = {}}));
  ASSERT_TRUE(s.a->early_anomaly().has_value());
  poll_until(s, [&] { return rows_in(s); });
  EXPECT_EQ(s.a->selected_step(), 2);
  s.a->enable_analysis();
  settle(s);
  ASSERT_NE(s.a->report(), nullptr);
  ASSERT_TRUE(s.a->report()->anomalies.empty()) << "premise: a lone skipped step is the scaler's job";
  EXPECT_EQ(s.a->selected_step(), 0) << "what the viewer shows of a trace without anomalies";
  EXPECT_EQ(s.anomaly_note,
            "The analysis found no anomaly: step 2 (gradient of fc1.weight held inf/NaN, from the trace's events) is not "
            "one. Showing step 0.");
}

TEST(early_anomaly_view, the_users_step_and_op_and_step_option_keep_precedence_over_both) {
  const auto path = fixture("user", {.origin_step = 4, .skipped_step = 1, .extra = {}});
  {
    // A click on another step while the early anomaly is shown: the label goes, the analysis moves nothing.
    ViewerState s;
    open_unanalysed(s, path);
    poll_until(s, [&] { return rows_in(s); });
    ASSERT_EQ(s.a->selected_step(), 1);
    select_step(s, 2);
    EXPECT_FALSE(s.early_shown);
    s.a->enable_analysis();
    settle(s);
    EXPECT_EQ(s.a->selected_step(), 2);
    EXPECT_EQ(s.anomaly_note, "");
  }
  {
    // An op picked in the early anomaly's step: the step and op stay when the analysis (elsewhere) ends.
    ViewerState s;
    open_unanalysed(s, path);
    poll_until(s, [&] { return rows_in(s); });
    select_op(s, 2);
    s.a->enable_analysis();
    settle(s);
    EXPECT_EQ(s.a->selected_step(), 1);
    EXPECT_EQ(s.selected_seq, 2);
    EXPECT_FALSE(s.early_shown) << "the analysis ended: nothing provisional left";
    EXPECT_EQ(s.anomaly_note, "");
  }
  {
    // --step 3 --seq 0: neither the early anomaly nor the analysis moves it.
    ViewerState s;
    s.wanted_step = 3;
    s.wanted_seq = 0;
    open_unanalysed(s, path);
    poll_until(s, [&] { return rows_in(s); });
    EXPECT_EQ(s.a->selected_step(), 3);
    EXPECT_FALSE(s.early_shown);
    s.a->enable_analysis();
    settle(s);
    EXPECT_EQ(s.a->selected_step(), 3);
    EXPECT_EQ(s.selected_seq, 0);
  }
  {
    // --seq alone picks the op in the early anomaly's step (as it does in the analysis's).
    ViewerState s;
    s.wanted_seq = 2;
    open_unanalysed(s, fixture("user_seq", {.origin_step = 3, .extra = {}}));
    poll_until(s, [&] { return rows_in(s); });
    EXPECT_EQ(s.a->selected_step(), 3);
    EXPECT_EQ(s.selected_seq, 2);
  }
}

TEST(early_anomaly_view, without_anomaly_events_the_step_rows_name_the_step_and_its_rows_the_op) {
  // No events at all (as analysis_bench's traces, or a recorder that writes none): /steps alone, the op from the
  // step's origin row once its rows are read.
  ViewerState s;
  open_unanalysed(s, fixture("no_events", {.origin_step = 2, .origin_events = false, .extra = {}}));
  EXPECT_EQ(s.a->counts().events, 0);
  ASSERT_TRUE(s.a->early_anomaly().has_value());
  EXPECT_EQ(s.a->early_anomaly()->step, 2);
  EXPECT_FALSE(s.a->early_anomaly()->from_events);
  EXPECT_EQ(s.a->early_anomaly()->what, "loss nan, inf/NaN in the gradients, skipped step");
  poll_until(s, [&] { return rows_in(s) && s.selected_seq; });
  EXPECT_EQ(s.a->selected_step(), 2);
  EXPECT_EQ(s.selected_seq, 1) << "fc2's linear, the step's origin row";
}

TEST(early_anomaly_view, an_event_of_a_step_without_rows_or_naming_an_op_the_step_lacks_misleads_nothing) {
  {
    // An origin event of step 40 (no /steps row, no op rows) and one of step -1, in a healthy trace: no early
    // anomaly; the viewer shows the first step, as without events.
    ViewerState s;
    open_paths(s, {fixture("stray", {.extra = {trace::EventRow{.step = 40, .seq = 0, .kind = "origin", .op = "exp",
                                                               .module = "fc1", .detail = ""},
                                               trace::EventRow{.step = -1, .seq = 0, .kind = "origin", .op = "exp",
                                                               .module = "fc1", .detail = ""}}})
                            .string()});
    ASSERT_TRUE(s.a && s.a->ok());
    EXPECT_EQ(s.a->counts().events, 2);
    EXPECT_FALSE(s.a->early_anomaly().has_value());
    settle(s);
    EXPECT_EQ(s.a->selected_step(), 0);
    EXPECT_FALSE(s.early_shown);
    EXPECT_EQ(s.anomaly_note, "");
  }
  {
    // An origin event naming seq 9 in step 2, whose rows are seq 0..2 and all finite: step 2 is shown, no op.
    ViewerState s;
    open_unanalysed(s, fixture("bad_seq", {.extra = {trace::EventRow{.step = 2, .seq = 9, .kind = "origin", .op = "exp",
                                                                     .module = "fc1", .detail = ""}}}));
    ASSERT_TRUE(s.a->early_anomaly().has_value());
    EXPECT_EQ(s.a->early_anomaly()->seq, 9);
    poll_until(s, [&] { return rows_in(s) && s.early_op_for != 0; });
    EXPECT_EQ(s.a->selected_step(), 2);
    EXPECT_EQ(s.selected_seq, std::nullopt) << "no row of step 2 has seq 9";
  }
}

TEST(early_anomaly_view, a_damaged_events_table_leaves_the_choice_to_the_step_rows) {
  // /events' stored chunk replaced by bytes that are no deflate stream (as a disk or a hand could leave it): the
  // search at open cannot read the events, and /steps' own flag (step 2: NaN loss, skipped) names the step.
  const auto path = fixture("damaged_events", {.origin_step = 2, .extra = {}});
  {
    ViewerState intact;
    open_unanalysed(intact, path);
    ASSERT_TRUE(intact.a->early_anomaly().has_value());
    ASSERT_TRUE(intact.a->early_anomaly()->from_events) << "the premise: intact, the events name the step";
  }
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  const hid_t events = H5Dopen2(file, "/events", H5P_DEFAULT);
  ASSERT_GE(events, 0);
  hsize_t stored = 0;
  const hsize_t origin[1] = {0};
  ASSERT_GE(H5Dget_chunk_storage_size(events, origin, &stored), 0);
  ASSERT_GT(stored, 0u);
  const std::vector<unsigned char> garbage(stored, 0xA5);
  ASSERT_GE(H5Dwrite_chunk(events, H5P_DEFAULT, 0, origin, garbage.size(), garbage.data()), 0);
  H5Dclose(events);
  H5Fclose(file);
  ViewerState s;
  open_unanalysed(s, path);
  ASSERT_TRUE(s.a->early_anomaly().has_value());
  EXPECT_EQ(s.a->early_anomaly()->step, 2);
  EXPECT_FALSE(s.a->early_anomaly()->from_events);
  EXPECT_EQ(s.a->early_anomaly()->what, "loss nan, inf/NaN in the gradients, skipped step");
}

TEST(early_anomaly_view, a_trace_whose_events_table_was_removed_is_refused_as_before_and_an_empty_one_reads) {
  const auto path = fixture("no_table", {.origin_step = 1, .extra = {}});
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  ASSERT_GE(H5Ldelete(file, "/events", H5P_DEFAULT), 0);
  H5Fclose(file);
  ViewerState s;
  open_paths(s, {path.string()});
  EXPECT_EQ(s.a, nullptr);
  ASSERT_EQ(s.errors.size(), 1u);
  EXPECT_NE(s.errors[0].find("the dataset '/events' is missing"), std::string::npos) << s.errors[0];
  // An empty /events and nothing flagged: no early anomaly, the first step while the analysis runs.
  ViewerState h;
  open_paths(h, {fixture("healthy", {.extra = {}}).string()});
  ASSERT_TRUE(h.a && h.a->ok());
  EXPECT_FALSE(h.a->early_anomaly().has_value());
  settle(h);
  EXPECT_EQ(h.a->selected_step(), 0);
  EXPECT_TRUE(h.a->report()->anomalies.empty());
}

TEST(early_anomaly_view, a_document_reads_the_early_anomalys_step_before_its_analysis_unless_told_not_to) {
  const auto path = fixture("prefetch", {.origin_step = 2, .extra = {}});
  for (const bool read_early : {true, false}) {
    TraceDocument::Options o;
    o.read_early_step = read_early;
    auto doc = TraceDocument::open(path, o);
    ASSERT_TRUE(doc->ok()) << doc->error();
    doc->wait_idle();  // the analysis and any read done, nothing selected
    EXPECT_FALSE(doc->selected_step().has_value());
    doc->select_step(2);
    if (read_early) {
      ASSERT_NE(doc->step_data(), nullptr) << "step 2's rows were read at open: no new read";
      EXPECT_EQ(doc->step_data()->ops.size(), 3u);
      EXPECT_FALSE(doc->step_loading());
    } else {
      EXPECT_EQ(doc->step_data(), nullptr) << "nothing was read at open: the selection reads it now";
      doc->wait_idle();
      ASSERT_NE(doc->step_data(), nullptr);
    }
    EXPECT_EQ(doc->step_data()->ops[1].seq, 1);
    EXPECT_TRUE(doc->step_data()->ops[1].origin);
  }
}

TEST(early_anomaly_view, the_search_at_open_reads_at_most_100000_event_rows_then_leaves_it_to_the_analysis) {
  // 8 steps, 30,000 cast_underflow events (no anomaly) in each of steps 0..6, an origin event in step 7 and no step
  // row flagged. The ranges read: step 0 (30,000 rows), steps 1-2 (60,000), steps 3-5 (90,000: the widest range,
  // 100,000 / 26,250 rows a step, is 3 steps); 180,000 rows read is past the bound, so step 7 is not reached.
  EarlyFixture f{.steps = 8, .extra = {}};
  for (std::int64_t step = 0; step < 7; ++step)
    for (int k = 0; k < 30000; ++k)
      f.extra.push_back(trace::EventRow{.step = step, .seq = 0, .kind = "cast_underflow", .op = "to", .module = "fc1", .detail = "x"});
  f.extra.push_back(trace::EventRow{.step = 7, .seq = 1, .kind = "origin", .op = "linear", .module = "fc2", .detail = ""});
  auto doc = TraceDocument::open(fixture("many_events", f), TraceDocument::Options{.analyse = false});
  ASSERT_TRUE(doc->ok()) << doc->error();
  EXPECT_EQ(doc->counts().events, 7 * 30000 + 1);
  EXPECT_FALSE(doc->early_anomaly().has_value());
  // With underflows in steps 0..2 only, the origin is within reach: steps 0, 1-2 (90,000 rows), then 3-6 hold it.
  f = EarlyFixture{.steps = 8, .extra = {}};
  for (std::int64_t step = 0; step < 3; ++step)
    for (int k = 0; k < 30000; ++k)
      f.extra.push_back(trace::EventRow{.step = step, .seq = 0, .kind = "cast_underflow", .op = "to", .module = "fc1", .detail = "x"});
  f.extra.push_back(trace::EventRow{.step = 5, .seq = 1, .kind = "origin", .op = "linear", .module = "fc2", .detail = ""});
  doc = TraceDocument::open(fixture("some_events", f), TraceDocument::Options{.analyse = false});
  ASSERT_TRUE(doc->ok()) << doc->error();
  ASSERT_TRUE(doc->early_anomaly().has_value());
  EXPECT_EQ(doc->early_anomaly()->step, 5);
  EXPECT_EQ(doc->early_anomaly()->seq, 1);
}

}  // namespace
}  // namespace ampscope::viewer
