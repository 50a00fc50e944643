#pragma once
// loom::data::chat_template: a model's chat template (Jinja, as Hugging Face ships it in
// tokenizer_config.json or chat_template.jinja) rendered in C++ as transformers'
// `apply_chat_template(..., tokenize=False)` renders it: the same text, byte for byte, and the byte
// ranges that `{% generation %}` blocks wrote (transformers' `return_assistant_tokens_mask`).
//
// The engine implements the part of Jinja that chat templates use (docs/chat_templates.md lists it);
// a template that uses anything else is refused when it is read, naming the construct and its line.
// Rendering follows Python's jinja2 under transformers' settings (trim_blocks, lstrip_blocks, loop
// controls, its own tojson, raise_exception, strftime_now, the generation extension) and Python's
// own rules for values: `None`/`True`/`False`, floats as Python's repr, lists and dicts printed as
// Python prints them, lengths in code points.
//
// JSON objects are dicts whose order is their keys' order in the input, as Python's json.loads keeps
// it: the API takes nlohmann::ordered_json for that reason (an nlohmann::json converts to it
// implicitly, its keys then sorted).

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace loom::data {

// A template that cannot be read (bad syntax, a construct outside the subset), or a render that
// fails (an error the template makes, raise_exception): "loom: chat_template line 12: ...".
class chat_template_error : public std::runtime_error {
 public:
  using runtime_error::runtime_error;
};

struct chat_render_options {
  bool add_generation_prompt = false;
  // `tools` and `documents` as transformers passes them: always defined, `none` when null.
  nlohmann::ordered_json tools = nullptr;
  nlohmann::ordered_json documents = nullptr;
  // More names the template sees (an object): bos_token, eos_token, enable_thinking, date_string, ...
  // They take precedence over the special tokens read by from_pretrained.
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
};

struct rendered_chat {
  std::string text;
  // Byte ranges [begin, end) of `text` that {% generation %} ... {% endgeneration %} blocks produced,
  // in order; empty when the template has none.
  std::vector<std::pair<std::size_t, std::size_t>> generation;
};

class chat_template {
 public:
  // tokenizer_config.json's "chat_template" (a string, or a list of {name, template}: the one named
  // "default"), else chat_template.jinja beside it; the special tokens that tokenizer_config.json
  // names (bos, eos, unk, sep, pad, cls, mask: strings or {"content": ...}) become variables of every
  // render, as transformers passes its special_tokens_map. With `template_file`, a Jinja file's text
  // replaces the folder's template (TRL's chat_template_path) and the special tokens are still the folder's.
  [[nodiscard]] static chat_template from_pretrained(const std::filesystem::path& dir,
                                                     const std::filesystem::path& template_file = {});
  // A template's text; `name` is how errors name it.
  [[nodiscard]] static chat_template from_text(std::string source, std::string name = "chat_template");

  chat_template(chat_template&&) noexcept;
  chat_template& operator=(chat_template&&) noexcept;
  ~chat_template();

  // `messages` is a list of message objects. As apply_chat_template does, each message's null
  // fields are dropped and its reasoning (reasoning_content, thinking or reasoning) is offered under
  // both `reasoning_content` and `thinking`.
  [[nodiscard]] rendered_chat render(const nlohmann::ordered_json& messages,
                                     const chat_render_options& options = {}) const;
  [[nodiscard]] bool has_generation_blocks() const noexcept;
  // XXH3-64 of the template's text and the special tokens read with it: what a dataset's saved position
  // records of the template, so that a resume with another one is refused.
  [[nodiscard]] std::uint64_t digest() const noexcept;

  struct impl;

 private:
  explicit chat_template(std::unique_ptr<impl> core);
  std::unique_ptr<impl> core_;
};

}  // namespace loom::data
