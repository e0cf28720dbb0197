// cli/suggest.h: "did you mean" for mistyped command and option names. Distances worked by hand.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/suggest.h"

namespace ampscope::samples {
namespace {

const std::vector<std::string> kCommands = {"demo", "train", "report", "diff", "export", "fix"};

TEST(edit_distance_test, counts_insertions_deletions_substitutions_and_neighbour_swaps_as_one_edit_each) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("", "fix"), 3u);
  EXPECT_EQ(edit_distance("report", "report"), 0u);
  EXPECT_EQ(edit_distance("repot", "report"), 1u);   // one insertion
  EXPECT_EQ(edit_distance("reports", "report"), 1u); // one deletion
  EXPECT_EQ(edit_distance("reXort", "report"), 1u);  // one substitution
  EXPECT_EQ(edit_distance("tarin", "train"), 1u);    // neighbours swapped
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u); // the textbook case
}

TEST(closest_name_test, names_the_command_one_typo_away) {
  EXPECT_EQ(closest_name("repot", kCommands), "report");
  EXPECT_EQ(closest_name("tarin", kCommands), "train");
  EXPECT_EQ(closest_name("exprot", kCommands), "export");
  EXPECT_EQ(closest_name("dif", kCommands), "diff");
}

TEST(closest_name_test, takes_a_prefix_of_three_letters_or_more_as_close) {
  EXPECT_EQ(closest_name("rep", kCommands), "report");
  EXPECT_EQ(closest_name("tra", kCommands), "train");
}

TEST(closest_name_test, suggests_nothing_for_a_different_word) {
  EXPECT_EQ(closest_name("view", kCommands), "");
  EXPECT_EQ(closest_name("frobnicate", kCommands), "");
  EXPECT_EQ(closest_name("x", kCommands), "");
}

TEST(closest_name_test, prefers_the_nearest_of_two_close_names) {
  EXPECT_EQ(closest_name("--stepz", {"--step-every", "--steps"}), "--steps");
}

}  // namespace
}  // namespace ampscope::samples
