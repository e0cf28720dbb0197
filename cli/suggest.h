// cli/suggest.h: "did you mean" for names a person typed: the known name closest to a mistyped one, by edit
// distance, when it is close enough to be a typo rather than another word.
//
//   closest_name("repot", {"report", "diff"})   // "report"
//   closest_name("view", {"report", "diff"})    // "" (nothing close)
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ampscope::samples {

// Levenshtein distance (insertions, deletions, substitutions), with a swap of two neighbouring letters
// counted as one edit: "stpes" is one edit from "steps".
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// The known name nearest to `typed`, or "" when none is within a third of the typed length (at least one
// edit): a prefix of a known name ("rep" for "report") counts as close.
inline std::string closest_name(std::string_view typed, const std::vector<std::string>& known) {
  std::string best;
  std::size_t best_distance = std::string::npos;
  const std::size_t limit = std::max<std::size_t>(1, typed.size() / 3);
  for (const std::string& name : known) {
    std::size_t distance = edit_distance(typed, name);
    if (typed.size() >= 3 && name.starts_with(typed)) distance = std::min<std::size_t>(distance, 1);
    if (distance <= limit && distance < best_distance) {
      best = name;
      best_distance = distance;
    }
  }
  return best;
}

}  // namespace ampscope::samples
