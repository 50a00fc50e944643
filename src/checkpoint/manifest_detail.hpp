#pragma once
// What the manifest's code (src/checkpoint/manifest.cpp) shares with the rest of src/checkpoint, not
// public: the manifest as its JSON, a checksum as the manifest writes it, and the error that a
// checkpoint whose bytes are not those its save wrote is.

#include <loom/base/text.hpp>
#include <loom/checkpoint/checkpoint.hpp>
#include <loom/checkpoint/manifest.hpp>

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>

namespace loom::checkpoint_detail {

// A checksum, or the schedule's fingerprint, as the manifest writes it: 16 hexadecimal digits.
[[nodiscard]] std::string hex(std::uint64_t value);

// The manifest's JSON: its format, its fields, its files, and last its own checksum.
[[nodiscard]] nlohmann::json manifest_json(const checkpoint_manifest& manifest);

// A checkpoint whose bytes are not those its save wrote: a manifest or a file damaged, missing,
// truncated or replaced. Unlike a checkpoint of another plan, an earlier one may still be good.
class checkpoint_damage : public checkpoint_error {
 public:
  checkpoint_damage(const std::filesystem::path& checkpoint, std::string problem)
      : checkpoint_error(error_message("the checkpoint '{}' cannot be resumed: {}", checkpoint.string(), problem)),
        problem_(std::move(problem)) {}
  [[nodiscard]] const std::string& problem() const noexcept { return problem_; }

 private:
  std::string problem_;
};

[[noreturn]] inline void damaged(const std::filesystem::path& checkpoint, std::string problem) {
  throw checkpoint_damage(checkpoint, std::move(problem));
}

}  // namespace loom::checkpoint_detail
