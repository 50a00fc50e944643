#pragma once
// A checkpoint's config.json as the models read it: every message names the model and the file, and
// says what to give. Shared by the models' *_config::from_pretrained and from_json.

#include <loom/base/text.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace loom::models::detail {

// config.json's text, from a checkpoint folder or the file itself; std::invalid_argument naming
// `model` ("Llama") and the file, with `what_to_give`, when it cannot be read. Returns the file's
// path, for the messages, and its text.
[[nodiscard]] std::pair<std::string, std::string> read_config_text(const std::filesystem::path& path,
                                                                   std::string_view model,
                                                                   std::string_view what_to_give);

class config_json {
 public:
  // Parses `text`; one that is not a JSON object is refused, with `what_to_give`.
  config_json(std::string_view text, std::string model, std::string source, std::string_view what_to_give);

  // Throws std::invalid_argument("loom: <model> config '<source>': <message>").
  template <class... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) const {
    throw_error<std::invalid_argument>("{} config '{}': {}", model_, source_,
                                       fmt::format(format, std::forward<Args>(args)...));
  }

  [[nodiscard]] const nlohmann::json& root() const noexcept { return root_; }
  // The value of `key` in `object` (the root by default); none when missing or null.
  [[nodiscard]] const nlohmann::json* find(const nlohmann::json& object, const std::string& key) const;
  [[nodiscard]] const nlohmann::json* find(const std::string& key) const { return find(root_, key); }

  [[nodiscard]] std::int64_t positive(const nlohmann::json& value, const std::string& key) const;
  // A positive whole number; without a fallback a missing one is refused.
  [[nodiscard]] std::int64_t whole(const nlohmann::json& object, const std::string& key,
                                   std::optional<std::int64_t> fallback) const;
  [[nodiscard]] std::int64_t whole(const std::string& key, std::optional<std::int64_t> fallback) const {
    return whole(root_, key, fallback);
  }
  [[nodiscard]] std::optional<std::int64_t> optional_whole(const std::string& key) const;
  // A positive number.
  [[nodiscard]] double number(const nlohmann::json& object, const std::string& key, double fallback) const;
  [[nodiscard]] double number(const std::string& key, double fallback) const { return number(root_, key, fallback); }
  [[nodiscard]] bool flag(const std::string& key, bool fallback) const;

 private:
  nlohmann::json root_;
  std::string model_;
  std::string source_;
};

}  // namespace loom::models::detail
