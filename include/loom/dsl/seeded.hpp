// seeded(s): build the model (and the LoRA weights) from a forked RNG seeded with s.
#pragma once

#include <loom/dsl/describe.hpp>
#include <loom/dsl/pipe.hpp>
#include <loom/dsl/stage_kind.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

class seeded_stage : public detail::pipeable {
 public:
  static constexpr stage_kind kind = stage_kind::seeded;
  static constexpr std::string_view name = "seeded";

  constexpr explicit seeded_stage(std::uint64_t seed) noexcept : seed_(seed) {}

  [[nodiscard]] constexpr std::uint64_t seed() const noexcept { return seed_; }
  [[nodiscard]] std::string options() const { return detail::to_text(seed_); }
  [[nodiscard]] std::string describe() const { return detail::call_text(name, options()); }

 private:
  std::uint64_t seed_;
};

constexpr seeded_stage seeded(std::uint64_t seed) noexcept { return seeded_stage(seed); }

}  // namespace loom
