// What a rule function reports: the first broken rule of a plan, or none.
#pragma once

#include <loom/dsl/rule_table.hpp>

#include <string_view>

namespace loom {

// One enumerator per row of the rule table. The rule functions return those of the order and value
// rules; those of the type rules (R7, R8, R13) name sentences that are reported while compiling.
enum class violation : unsigned char {
  none,
#define LOOM_DETAIL_ENUMERATOR(id, text) id,
  LOOM_RULES(LOOM_DETAIL_ENUMERATOR)
#undef LOOM_DETAIL_ENUMERATOR
};

// The sentence printed for v: "loom R<n>: what is wrong: the fix (why)"; empty for none.
constexpr std::string_view sentence(violation v) noexcept {
  switch (v) {
    case violation::none: return {};
#define LOOM_DETAIL_SENTENCE(id, text) \
  case violation::id: return text;
      LOOM_RULES(LOOM_DETAIL_SENTENCE)
#undef LOOM_DETAIL_SENTENCE
  }
  return {};
}

// The rule id n of "loom R<n>: ..."; 0 for none. Read from the sentence so the two cannot disagree.
constexpr int rule_of(violation v) noexcept {
  constexpr std::string_view prefix = "loom R";
  const std::string_view text = sentence(v);
  if (!text.starts_with(prefix)) return 0;
  int id = 0;
  for (char c : text.substr(prefix.size())) {
    if (c < '0' || c > '9') break;
    id = id * 10 + (c - '0');
  }
  return id;
}

}  // namespace loom
