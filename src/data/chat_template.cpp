#include <loom/base/text.hpp>
#include <loom/data/chat_template.hpp>
#include <loom/io/checksum.hpp>

#include "jinja.hpp"
#include "utf8.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::data {

using nlohmann::ordered_json;

struct chat_template::impl {
  jinja::program tree;
  std::uint64_t digest = 0;  // of the text, then of the special tokens
  // tokenizer_config.json's special tokens: what transformers passes as its special_tokens_map.
  std::vector<std::pair<std::string, jinja::value>> special_tokens;
};

namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error<chat_template_error>("cannot read {}", path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The conversation as apply_chat_template hands it to the template: each message's null fields
// dropped, and its reasoning under `thinking` (first) and `reasoning_content` (as transformers'
// _alias_reasoning_fields writes {"thinking": r, **message, "reasoning_content": r}).
jinja::value messages_value(const ordered_json& messages) {
  if (!messages.is_array())
    throw_error<chat_template_error>("the messages are a JSON {}, not a list", messages.type_name());
  if (messages.empty()) {
    throw_error<chat_template_error>("the conversation is empty (transformers refuses to apply a chat template to it)");
  }
  jinja::value_list items;
  for (std::size_t k = 0; k < messages.size(); ++k) {
    const ordered_json& message = messages[k];
    if (!message.is_object()) {
      throw_error<chat_template_error>("message {} is a JSON {}, not an object", k, message.type_name());
    }
    ordered_json kept = ordered_json::object();
    for (const auto& [key, field] : message.items()) {
      if (!field.is_null()) kept[key] = field;
    }
    const ordered_json* reasoning = nullptr;
    for (const std::string_view field : {"reasoning_content", "thinking", "reasoning"}) {
      if (const auto found = kept.find(field); found != kept.end()) {
        reasoning = &*found;
        break;
      }
    }
    if (reasoning != nullptr) {
      ordered_json aliased = ordered_json::object();
      aliased["thinking"] = *reasoning;
      for (const auto& [key, field] : kept.items()) aliased[key] = field;
      aliased["reasoning_content"] = *reasoning;
      kept = std::move(aliased);
    }
    items.push_back(jinja::from_json(kept));
  }
  return jinja::make_list(std::move(items));
}

// A special token in tokenizer_config.json: a string, or an AddedToken's {"content": ...}.
const ordered_json* token_text(const ordered_json& entry) {
  if (entry.is_string()) return &entry;
  if (entry.is_object()) {
    if (const auto content = entry.find("content"); content != entry.end() && content->is_string()) return &*content;
  }
  return nullptr;
}

}  // namespace

chat_template::chat_template(std::unique_ptr<impl> core) : core_(std::move(core)) {}
chat_template::chat_template(chat_template&&) noexcept = default;
chat_template& chat_template::operator=(chat_template&&) noexcept = default;
chat_template::~chat_template() = default;

chat_template chat_template::from_text(std::string source, std::string name) {
  if (const auto bad = detail::invalid_utf8_at(source)) {
    throw_error<chat_template_error>("{}: the template is not valid UTF-8 (byte {})", name, *bad);
  }
  auto core = std::make_unique<impl>();
  core->tree = jinja::parse(source, std::move(name));
  xxh3_stream text;
  text.update(source.data(), source.size());
  core->digest = text.digest().xxh3;
  return chat_template(std::move(core));
}

chat_template chat_template::from_pretrained(const std::filesystem::path& dir,
                                             const std::filesystem::path& template_file) {
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  const std::filesystem::path file_path = dir / "chat_template.jinja";
  ordered_json config = ordered_json::object();
  if (std::filesystem::exists(config_path)) {
    try {
      config = ordered_json::parse(read_file(config_path));
    } catch (const ordered_json::exception& error) {
      throw_error<chat_template_error>("{} is not JSON: {}", config_path.string(), error.what());
    }
    if (!config.is_object()) throw_error<chat_template_error>("{} holds no JSON object", config_path.string());
  }

  // As transformers does, chat_template.jinja takes priority over the config's entry.
  std::string source;
  std::string name;
  if (!template_file.empty()) {
    if (!std::filesystem::is_regular_file(template_file)) {
      throw_error<chat_template_error>("the chat template file {} does not exist: give a Jinja file",
                                       template_file.string());
    }
    source = read_file(template_file);
    name = template_file.filename().string();
  } else if (std::filesystem::exists(file_path)) {
    source = read_file(file_path);
    name = file_path.filename().string();
  } else if (const auto entry = config.find("chat_template"); entry != config.end() && !entry->is_null()) {
    name = "chat_template";
    if (entry->is_string()) {
      source = entry->get<std::string>();
    } else if (entry->is_array()) {
      std::vector<std::string> names;
      for (const ordered_json& named : *entry) {
        if (!named.is_object() || !named.contains("name") || !named.contains("template") ||
            !named["name"].is_string() || !named["template"].is_string()) {
          throw_error<chat_template_error>("{}: chat_template's list holds an entry without a name and a template",
                                           config_path.string());
        }
        names.push_back(named["name"].get<std::string>());
        if (names.back() == "default") source = named["template"].get<std::string>();
      }
      if (std::find(names.begin(), names.end(), "default") == names.end()) {
        throw_error<chat_template_error>("{}: chat_template lists templates but none named 'default' (it has {})",
                                         config_path.string(), some_of(names));
      }
    } else {
      throw_error<chat_template_error>("{}: chat_template is a JSON {}, not a string or a list", config_path.string(),
                                       entry->type_name());
    }
  } else {
    throw_error<chat_template_error>("{} has no chat template (no chat_template.jinja, and no chat_template in {})",
                                     dir.string(), config_path.filename().string());
  }

  chat_template loaded = from_text(std::move(source), std::move(name));
  for (const std::string_view key :
       {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (const auto entry = config.find(key); entry != config.end()) {
      if (const ordered_json* text = token_text(*entry)) {
        loaded.core_->special_tokens.emplace_back(std::string(key), text->get<std::string>());
        const std::string named = fmt::format("{}={}", key, text->get<std::string>());
        xxh3_stream digest;
        digest.update(&loaded.core_->digest, sizeof loaded.core_->digest);
        digest.update(named.data(), named.size() + 1);
        loaded.core_->digest = digest.digest().xxh3;
      }
    }
  }
  return loaded;
}

std::uint64_t chat_template::digest() const noexcept { return core_->digest; }

rendered_chat chat_template::render(const ordered_json& messages, const chat_render_options& options) const {
  if (!options.variables.is_object()) {
    throw_error<chat_template_error>("the render's variables are a JSON {}, not an object",
                                     options.variables.type_name());
  }
  std::vector<std::pair<std::string, jinja::value>> names = core_->special_tokens;
  names.emplace_back("messages", messages_value(messages));
  names.emplace_back("tools", jinja::from_json(options.tools));
  names.emplace_back("documents", jinja::from_json(options.documents));
  names.emplace_back("add_generation_prompt", options.add_generation_prompt);
  for (const auto& [key, variable] : options.variables.items()) {
    for (const std::string_view reserved : {"messages", "tools", "documents", "add_generation_prompt"}) {
      if (key == reserved) {
        throw_error<chat_template_error>("the variable '{}' is given by the render's own argument, not in variables",
                                         key);
      }
    }
    names.emplace_back(key, jinja::from_json(variable));
  }
  jinja::rendering result = jinja::render(core_->tree, names);
  return rendered_chat{std::move(result.text), std::move(result.generation)};
}

bool chat_template::has_generation_blocks() const noexcept { return core_->tree.has_generation; }

}  // namespace loom::data
