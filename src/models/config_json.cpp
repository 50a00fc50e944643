#include "config_json.hpp"

#include <fstream>
#include <sstream>

namespace loom::models::detail {

using json = nlohmann::json;

std::pair<std::string, std::string> read_config_text(const std::filesystem::path& path, std::string_view model,
                                                     std::string_view what_to_give) {
  const std::filesystem::path file = std::filesystem::is_directory(path) ? path / "config.json" : path;
  std::ifstream in(file);
  if (!in) throw_error<std::invalid_argument>("{} config '{}' cannot be read: {}", model, file.string(), what_to_give);
  std::stringstream text;
  text << in.rdbuf();
  return {file.string(), text.str()};
}

config_json::config_json(std::string_view text, std::string model, std::string source, std::string_view what_to_give)
    : root_(json::parse(text, nullptr, /*allow_exceptions=*/false)),
      model_(std::move(model)),
      source_(std::move(source)) {
  if (root_.is_discarded() || !root_.is_object()) fail("not a JSON object: {}", what_to_give);
}

const json* config_json::find(const json& object, const std::string& key) const {
  const auto found = object.find(key);
  return found == object.end() || found->is_null() ? nullptr : &*found;
}

std::int64_t config_json::positive(const json& value, const std::string& key) const {
  if (!value.is_number_integer() || value.get<std::int64_t>() <= 0) {
    fail("'{}' is {}: give a positive whole number", key, value.dump());
  }
  return value.get<std::int64_t>();
}

std::int64_t config_json::whole(const json& object, const std::string& key,
                                std::optional<std::int64_t> fallback) const {
  const json* value = find(object, key);
  if (value) return positive(*value, key);
  if (!fallback) fail("'{}' is missing: a {} config.json gives it as a positive whole number", key, model_);
  return *fallback;
}

std::optional<std::int64_t> config_json::optional_whole(const std::string& key) const {
  const json* value = find(key);
  if (!value) return std::nullopt;
  return positive(*value, key);
}

double config_json::number(const json& object, const std::string& key, double fallback) const {
  const json* value = find(object, key);
  if (!value) return fallback;
  if (!value->is_number() || value->get<double>() <= 0) fail("'{}' is {}: give a positive number", key, value->dump());
  return value->get<double>();
}

bool config_json::flag(const std::string& key, bool fallback) const {
  const json* value = find(key);
  if (!value) return fallback;
  if (!value->is_boolean()) fail("'{}' is {}: give true or false", key, value->dump());
  return value->get<bool>();
}

}  // namespace loom::models::detail
