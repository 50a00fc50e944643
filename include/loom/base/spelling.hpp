#pragma once
// "Did you mean": the known names closest to a word a user typed, for the one sentence that refuses
// it (run-file keys, recipe flags, LoRA targets). Torch-free, so that the command lines and the
// run-file reader share it.

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

// Levenshtein distance with adjacent transpositions (optimal string alignment): "tagrets" is one
// edit from "targets", as a typist would count it.
[[nodiscard]] inline std::size_t edit_distance(std::string_view from, std::string_view to) {
  const std::size_t columns = to.size() + 1;
  std::vector<std::size_t> before_last(columns), last(columns), current(columns);
  for (std::size_t j = 0; j < columns; ++j) last[j] = j;
  for (std::size_t i = 1; i <= from.size(); ++i) {
    current[0] = i;
    for (std::size_t j = 1; j < columns; ++j) {
      const std::size_t substitution = from[i - 1] == to[j - 1] ? 0 : 1;
      current[j] = std::min({last[j] + 1, current[j - 1] + 1, last[j - 1] + substitution});
      if (i > 1 && j > 1 && from[i - 1] == to[j - 2] && from[i - 2] == to[j - 1]) {
        current[j] = std::min(current[j], before_last[j - 2] + 1);
      }
    }
    before_last.swap(last);
    last.swap(current);
  }
  return last[to.size()];
}

// The names `word` is likely a slip for, best first: those that end in it after a dot (`steps` for
// `train.steps`: a dotted key written without its section), those a third of its length or fewer
// edits away (at least one, at most three), and those it begins (`--steps` for `--steps-pretrain`).
// Empty when nothing is close: a suggestion far off misleads more than none.
[[nodiscard]] inline std::vector<std::string> closest_names(std::string_view word,
                                                            const std::vector<std::string>& names) {
  const std::size_t allowed = std::clamp<std::size_t>(word.size() / 3, 1, 3);
  std::vector<std::pair<std::size_t, std::string>> close;
  for (const std::string& name : names) {
    if (name == word) continue;
    const bool ends_after_dot = !word.empty() && name.size() > word.size() && name.ends_with(word) &&
                                name[name.size() - word.size() - 1] == '.';
    const std::size_t distance = ends_after_dot ? 0 : edit_distance(word, name);
    if (distance <= allowed) {
      close.emplace_back(distance, name);
    } else if (word.size() >= 3 && name.starts_with(word)) {
      close.emplace_back(allowed + 1, name);
    }
  }
  std::stable_sort(close.begin(), close.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> found;
  for (auto& [distance, name] : close) {
    if (std::find(found.begin(), found.end(), name) == found.end()) found.push_back(std::move(name));
  }
  return found;
}

// " (did you mean 'a' or 'b'?)", or nothing when no name is close: to end a refusal with.
[[nodiscard]] inline std::string did_you_mean(std::string_view word, const std::vector<std::string>& names,
                                              std::string_view quote = "'") {
  const std::vector<std::string> found = closest_names(word, names);
  if (found.empty()) return {};
  std::string text = " (did you mean ";
  for (std::size_t i = 0; i < found.size() && i < 3; ++i) {
    if (i > 0) text += i + 1 == std::min<std::size_t>(found.size(), 3) ? " or " : ", ";
    text.append(quote).append(found[i]).append(quote);
  }
  return text + "?)";
}

}  // namespace loom
