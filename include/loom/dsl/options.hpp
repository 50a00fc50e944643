// The fields of a stage's options struct, described once beside them: describe(), the run-file
// reader and its messages all read the list.
#pragma once

#include <loom/dsl/describe.hpp>

#include <string>
#include <string_view>
#include <tuple>

namespace loom {

// An options struct (a strategy's, mixed_precision's) describes its fields once, in a static fields() beside them: the
// name each has in describe() and in a run file, and the member. describe(), the run-file reader and
// its messages all read that list, so an option is one line in one place.
template <class Options, class T>
struct option_field {
  std::string_view name;
  T Options::*member;
};
template <class Options, class T>
option_field(std::string_view, T Options::*) -> option_field<Options, T>;  // clang before 17 needs it

template <class Options>
concept described_options = requires {
  Options::fields();
};

// The options as describe() prints them, every field spelled out: "bucket_cap_mb=25, ...".
template <described_options Options>
std::string options_text(const Options& settings) {
  std::string text;
  std::apply(
      [&](const auto&... field) {
        ((text.append(text.empty() ? "" : ", ")
              .append(field.name)
              .append("=")
              .append(detail::to_text(settings.*field.member))),
         ...);
      },
      Options::fields());
  return text;
}

}  // namespace loom
