// How a broken rule is reported: while compiling, as an error whose first line carries the sentence;
// at run time, as a loom::plan_error carrying the same sentence.
#pragma once

#include <loom/dsl/violation.hpp>

#include <cstddef>
#include <stdexcept>
#include <string>

namespace loom {

// Thrown when a plan assembled from run-time values breaks a rule.
class plan_error : public std::invalid_argument {
 public:
  explicit plan_error(violation v) : std::invalid_argument(std::string(sentence(v))), violation_(v) {}

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

// Fails when v is a violation: a compile error inside a constant evaluation (consteval stage
// functions), a plan_error otherwise. Value rules get a case each so their sentence shows up while
// compiling; rules on stage order are diagnosed by static_assert in operator| instead.
constexpr void enforce(violation v) {
  switch (v) {
    case violation::none: return;
    case violation::r5_rank_not_positive: report_error<LOOM_R5_RANK_NOT_POSITIVE>(v);
    case violation::r5_alpha_not_positive: report_error<LOOM_R5_ALPHA_NOT_POSITIVE>(v);
    case violation::r5_dropout_out_of_range: report_error<LOOM_R5_DROPOUT_OUT_OF_RANGE>(v);
    case violation::r5_no_targets: report_error<LOOM_R5_NO_TARGETS>(v);
    case violation::r5_empty_target: report_error<LOOM_R5_EMPTY_TARGET>(v);
    case violation::r5_duplicate_target: report_error<LOOM_R5_DUPLICATE_TARGET>(v);
    case violation::r5_empty_exclude: report_error<LOOM_R5_EMPTY_EXCLUDE>(v);
    case violation::r5_duplicate_exclude: report_error<LOOM_R5_DUPLICATE_EXCLUDE>(v);
    case violation::r11_no_patterns: report_error<LOOM_R11_NO_PATTERNS>(v);
    case violation::r11_empty_pattern: report_error<LOOM_R11_EMPTY_PATTERN>(v);
    case violation::r11_duplicate_pattern: report_error<LOOM_R11_DUPLICATE_PATTERN>(v);
    case violation::r12_too_many_targets: report_error<LOOM_R12_TOO_MANY_TARGETS>(v);
    default: throw plan_error(v);
  }
}

}  // namespace detail
}  // namespace loom
