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
// What an option changes. A checkpoint resumes only under the same `state` options (what training
// computes and holds), but under any `layout` ones: those place or move the same state differently
// across the ranks (fsdp's shard group size, whether it accumulates sharded), as the world size does.
enum class option_role { state, layout };

template <class Options, class T>
struct option_field {
  std::string_view name;
  T Options::*member;
  option_role role = option_role::state;
};
template <class Options, class T>
option_field(std::string_view, T Options::*) -> option_field<Options, T>;  // clang before 17 needs it
template <class Options, class T>
option_field(std::string_view, T Options::*, option_role) -> option_field<Options, T>;

template <class Options>
concept described_options = requires {
  Options::fields();
};

// The options as describe() prints them, every field spelled out: "bucket_cap_mb=25, ..."; with
// `state_only`, the state options alone (what a checkpoint must have been saved under).
template <described_options Options>
std::string options_text(const Options& settings, bool state_only = false) {
  std::string text;
  const auto append = [&](const auto& field) {
    if (state_only && field.role == option_role::layout) return;
    text.append(text.empty() ? "" : ", ")
        .append(field.name)
        .append("=")
        .append(detail::to_text(settings.*field.member));
  };
  std::apply([&](const auto&... field) { (append(field), ...); }, Options::fields());
  return text;
}

}  // namespace loom
