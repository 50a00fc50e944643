// How a broken rule is reported: while compiling, as an error whose first line carries the sentence;
// at run time, as a loom::plan_error carrying the same sentence.
#pragma once

#include <loom/dsl/rule_table.hpp>
#include <loom/dsl/violation.hpp>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace loom {

// Thrown when a plan assembled from run-time values breaks a rule.
class plan_error : public std::invalid_argument {
 public:
  explicit plan_error(violation v) : std::invalid_argument(std::string(sentence(v))), violation_(v) {}
  // The same rule said in other words: where a run file broke it, in that file's spelling.
  plan_error(violation v, const std::string& said) : std::invalid_argument(said), violation_(v) {}

  [[nodiscard]] violation code() const noexcept { return violation_; }
  [[nodiscard]] int rule() const noexcept { return rule_of(violation_); }

 private:
  violation violation_;
};

namespace detail {

// A string literal as a template argument, so that the compiler prints it in a diagnostic.
template <std::size_t N>
struct fixed_string {
  char text[N];
  consteval fixed_string(const char (&literal)[N]) {  // NOLINT: implicit, to take "..." as argument
    for (std::size_t i = 0; i != N; ++i) text[i] = literal[i];
  }
};

// Deliberately not constexpr (the technique {fmt} uses for format strings): reached while
// compiling, the call is the error, and the error's first line shows Sentence. At run time it throws.
template <fixed_string Sentence>
[[noreturn]] void report_error(violation v) {
  throw plan_error(v);
}

// Fails when v is a violation: a compile error inside a constant evaluation (the consteval stage
// functions), a plan_error otherwise. A case per row of the rule table, so that the error shows
// v's own sentence.
constexpr void enforce(violation v) {
  switch (v) {
    case violation::none:
      return;
      // One `case id: report_error<sentence>(v);` per row.
      LOOM_RULES(LOOM_DETAIL_REPORT_CASE)
  }
}

}  // namespace detail
}  // namespace loom
