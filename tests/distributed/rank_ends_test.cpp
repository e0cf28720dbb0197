// Which rank of a data-parallel run ended early (analysis::rank_ends), from what each rank's trace says: closed
// by its writer, still being written, ended by SIGTERM (the note mpirun's termination leaves), and its last
// durable step. Hand-made cases, each a situation a real run produces (ddp_killed_rank_test.sh runs the real
// one: rank 1 of `mpirun -np 2 ampscope train --ddp` killed), with the exact lines the multi-rank report prints.
// Pure functions: every rank of the distributed_tests program runs them alike.
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "probes/analysis/ranks.h"

namespace ampscope::analysis {
namespace {

RankEnd closed(int rank, std::int64_t last) { return {.rank = rank, .complete = true, .last_step = last}; }
RankEnd killed(int rank, std::optional<std::int64_t> last) { return {.rank = rank, .last_step = last}; }
RankEnd terminated(int rank, std::int64_t last) { return {.rank = rank, .terminated = true, .last_step = last}; }
RankEnd writing(int rank, std::int64_t last) { return {.rank = rank, .writing = true, .last_step = last}; }

TEST(rank_ends, a_run_every_rank_closed_finished_and_says_nothing) {
  const RankEnds e = rank_ends({closed(1, 49), closed(0, 49)});
  EXPECT_TRUE(e.finished());
  EXPECT_TRUE(e.ended_early.empty());
  EXPECT_FALSE(e.together);
  EXPECT_EQ(render_text(e), "");
  EXPECT_EQ(end_status(e, 0), "");
  EXPECT_EQ(end_status(e, 1), "");
}

TEST(rank_ends, ranks_still_being_written_are_a_run_in_progress_not_a_failure) {
  const RankEnds e = rank_ends({writing(0, 12), writing(1, 11)});
  EXPECT_TRUE(e.finished());
  EXPECT_EQ(render_text(e), "");
  EXPECT_EQ(end_status(e, 1), "incomplete: still being written");
}

// mpirun's usual sequence: rank 1 SIGKILLed after both flushed step 3641; rank 0, waiting for rank 1's
// gradients, is ended by mpirun's SIGTERM and notes it. The step counts are equal: the notes tell.
TEST(rank_ends, the_rank_that_died_without_notice_is_named_when_the_others_were_ended_by_sigterm) {
  const RankEnds e = rank_ends({terminated(0, 3641), killed(1, 3641)});
  EXPECT_FALSE(e.finished());
  EXPECT_EQ(e.ended_early, std::vector<int>{1});
  EXPECT_EQ(e.stopped, (std::vector<int>{0, 1}));
  EXPECT_EQ(render_text(e),
            "rank 1 ENDED EARLY: its trace stops at step 3641 without being closed by its writer; no termination request "
            "reached it: the rank died there (SIGKILL, a crash, the out-of-memory killer)\n"
            "rank 0 was then ended by SIGTERM (mpirun ends the other ranks when one dies)\n");
  EXPECT_EQ(end_status(e, 0), "incomplete: ended by SIGTERM");
  EXPECT_EQ(end_status(e, 1), "ENDED EARLY");
}

// Fewer durable steps: rank 1 was killed before its writer flushed step 57, which rank 0 had flushed.
TEST(rank_ends, the_rank_with_fewer_durable_steps_is_named_whatever_the_notes) {
  const RankEnds e = rank_ends({killed(0, 57), killed(1, 56)});
  EXPECT_EQ(e.ended_early, std::vector<int>{1});
  EXPECT_EQ(render_text(e),
            "rank 1 ENDED EARLY: its trace stops at step 56 without being closed by its writer, while rank 0's goes on "
            "to step 57; no termination request reached it: the rank died there (SIGKILL, a crash, the out-of-memory "
            "killer)\n"
            "rank 0 stopped too, without closing its trace\n");
  EXPECT_EQ(end_status(e, 0), "incomplete: not closed by its writer");

  // A rank SIGTERMed first (by hand) is named too, and said to have been ended so.
  const RankEnds t = rank_ends({terminated(0, 9), closed(1, 10), closed(2, 10)});
  EXPECT_EQ(t.ended_early, std::vector<int>{0});
  EXPECT_EQ(render_text(t),
            "rank 0 ENDED EARLY: its trace stops at step 9 without being closed by its writer, while rank 1's goes on "
            "to step 10; its process was ended by SIGTERM\n");
}

TEST(rank_ends, of_three_ranks_the_two_that_stopped_earliest_are_named) {
  const RankEnds e = rank_ends({terminated(0, 11), killed(1, 10), killed(2, 10)});
  EXPECT_EQ(e.ended_early, (std::vector<int>{1, 2}));
  EXPECT_EQ(end_status(e, 0), "incomplete: ended by SIGTERM");
  const std::string text = render_text(e);
  EXPECT_NE(text.find("rank 1 ENDED EARLY: its trace stops at step 10"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 2 ENDED EARLY: its trace stops at step 10"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 0 was then ended by SIGTERM"), std::string::npos) << text;
}

TEST(rank_ends, a_rank_that_never_flushed_a_step_stops_before_its_first_step) {
  const RankEnds e = rank_ends({killed(0, std::nullopt), writing(1, 0)});
  EXPECT_EQ(e.ended_early, std::vector<int>{0});
  EXPECT_EQ(render_text(e),
            "rank 0 ENDED EARLY: its trace stops before its first step without being closed by its writer, while rank "
            "1's goes on to step 0; no termination request reached it: the rank died there (SIGKILL, a crash, the "
            "out-of-memory killer)\n");
}

// The same step on every rank and no note anywhere (the whole job SIGKILLed, or traces older than the note):
// nothing tells which rank went first, and the report says so rather than guess.
TEST(rank_ends, every_rank_stopped_together_without_notice_names_no_rank) {
  const RankEnds e = rank_ends({killed(0, 1654), killed(1, 1654)});
  EXPECT_TRUE(e.ended_early.empty());
  EXPECT_TRUE(e.together);
  EXPECT_FALSE(e.finished());
  EXPECT_EQ(render_text(e),
            "the run did not finish: the traces of ranks 0, 1 stop at step 1654 without being closed by their writers, "
            "and no termination request reached them: the job was killed (the traces cannot tell which rank went "
            "first)\n");
  EXPECT_EQ(end_status(e, 0), "incomplete: not closed by its writer");
}

TEST(rank_ends, every_rank_ended_by_sigterm_together_is_an_unfinished_run_without_a_culprit) {
  const RankEnds e = rank_ends({terminated(1, 30), terminated(0, 30)});
  EXPECT_TRUE(e.ended_early.empty());
  EXPECT_TRUE(e.together);
  EXPECT_EQ(render_text(e), "the run did not finish: ranks 0, 1 were ended by SIGTERM at step 30, without closing their trace\n");
}

}  // namespace
}  // namespace ampscope::analysis
