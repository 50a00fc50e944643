// pretrained(path): the model's weights come from a checkpoint, a safetensors file, a folder or a
// sharded index (Hugging Face's layout), loaded by name and strictly once the model is built, before
// lora adapts it and the strategy wraps it. seeded(...) still seeds what the checkpoint does not
// hold, such as LoRA's A.
#pragma once

#include <loom/dsl/describe.hpp>
#include <loom/dsl/diagnostics.hpp>
#include <loom/dsl/pipe.hpp>
#include <loom/dsl/stage_kind.hpp>

#include <string>
#include <string_view>
#include <utility>

namespace loom {

class pretrained_stage : public detail::pipeable {
 public:
  static constexpr stage_kind kind = stage_kind::pretrained;
  static constexpr std::string_view name = "pretrained";

  // Throws plan_error (R19) for an empty path.
  static pretrained_stage checked(std::string path) {
    detail::enforce(path.empty() ? violation::r19_empty_path : violation::none);
    return pretrained_stage(std::move(path));
  }

  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] std::string options() const { return '"' + path_ + '"'; }
  [[nodiscard]] std::string describe() const { return detail::call_text(name, options()); }

 private:
  explicit pretrained_stage(std::string path) : path_(std::move(path)) {}

  std::string path_;
};

// pretrained("checkpoint/"): a path known only at run time, so the plan is not a constant.
inline pretrained_stage pretrained(std::string path) { return pretrained_stage::checked(std::move(path)); }

}  // namespace loom
