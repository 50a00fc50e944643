#include <loom/base/text.hpp>
#include <loom/data/chat_example.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <utility>
#include <vector>

namespace loom::data {
namespace {

using ordered_json = nlohmann::ordered_json;
using byte_range = std::pair<std::size_t, std::size_t>;

[[noreturn]] void refuse(const std::string& problem) { throw_error<std::invalid_argument>("{}", problem); }

// The record's conversation as the template reads it: each message's role mapped, its text under
// "content", its other keys (tool_calls, reasoning_content, ...) as they are.
ordered_json messages_of(const ordered_json& list, const chat_fields& fields, const std::string& field) {
  if (!list.is_array()) refuse(fmt::format("its '{}' is not a list of messages", field));
  ordered_json messages = ordered_json::array();
  for (std::size_t i = 0; i < list.size(); ++i) {
    const ordered_json& given = list[i];
    if (!given.is_object() || !given.contains(fields.role) || !given[fields.role].is_string()) {
      refuse(fmt::format("its '{}' message {} has no '{}' naming its role", field, i, fields.role));
    }
    const std::string role = given[fields.role].get<std::string>();
    const auto mapped = fields.roles.find(role);
    if (mapped == fields.roles.end()) {
      std::vector<std::string> known;
      for (const auto& [name, to] : fields.roles) known.push_back(name);
      refuse(fmt::format("its '{}' message {} has the role '{}', which is none of {}: map it in chat_fields::roles",
                         field, i, role, some_of(known)));
    }
    ordered_json message = ordered_json::object();
    message["role"] = mapped->second;
    for (const auto& [key, value] : given.items()) {
      if (key == fields.role) continue;
      message[key == fields.content ? std::string("content") : key] = value;
    }
    messages.push_back(std::move(message));
  }
  return messages;
}

// The byte ranges each assistant message adds after the generation prompt, by rendering the
// conversation up to it: the template must render each such prefix as the start of the whole.
std::vector<byte_range> assistant_ranges(const ordered_json& messages, const chat_template& chat,
                                         const chat_render_options& options, const std::string& whole) {
  std::vector<byte_range> ranges;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (messages[i]["role"] != "assistant") continue;
    chat_render_options before = options;
    before.add_generation_prompt = true;
    const std::string prompt =
        chat.render(ordered_json(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i)), before).text;
    chat_render_options through = options;
    through.add_generation_prompt = false;
    const std::string upto =
        chat.render(ordered_json(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i) + 1), through)
            .text;
    if (!upto.starts_with(prompt) || !whole.starts_with(upto)) {
      refuse(fmt::format(
          "the chat template renders the conversation up to message {} (an assistant's) as other than the start of "
          "the whole (it rewrites earlier turns, as some drop their reasoning), so its tokens cannot be told: give "
          "the template {{% generation %}} blocks, or train on every token",
          i));
    }
    ranges.emplace_back(prompt.size(), upto.size());
  }
  return ranges;
}

// `text` tokenized, each token labelled with itself when its bytes meet one of `ranges`.
example labelled(const std::string& text, const std::vector<byte_range>& ranges, const tokenizer& tokens,
                 loss_on loss) {
  const tokenizer::encoding encoded = tokens.encode_with_offsets(text);
  example made{encoded.ids, std::vector<std::int32_t>(encoded.ids.size(), -100)};
  for (std::size_t t = 0; t < encoded.ids.size(); ++t) {
    const auto [begin, end] = encoded.offsets[t];
    const bool in_range = std::any_of(ranges.begin(), ranges.end(),
                                      [&](const byte_range& r) { return begin < r.second && end > r.first; });
    if (loss == loss_on::every_token || in_range) made.labels[t] = encoded.ids[t];
  }
  return made;
}

}  // namespace

std::string_view name_of(loss_on loss) noexcept { return loss == loss_on::assistant ? "assistant" : "every_token"; }

chat_fields chat_fields::sharegpt() {
  chat_fields fields;
  fields.messages = "conversations";
  fields.role = "from";
  fields.content = "value";
  return fields;
}

example chat_example(const ordered_json& record, const chat_fields& fields, const chat_template& chat,
                     const tokenizer& tokens, loss_on loss, const chat_render_options& options) {
  if (!record.is_object()) refuse("the record is not a JSON object");
  if (record.contains(fields.messages)) {
    const ordered_json messages = messages_of(record[fields.messages], fields, fields.messages);
    const rendered_chat whole = chat.render(messages, options);
    if (loss == loss_on::every_token) return labelled(whole.text, {}, tokens, loss);
    return labelled(
        whole.text,
        chat.has_generation_blocks() ? whole.generation : assistant_ranges(messages, chat, options, whole.text), tokens,
        loss);
  }
  if (!record.contains(fields.prompt) || !record.contains(fields.completion)) {
    refuse(fmt::format("the record has neither '{}' nor both '{}' and '{}'", fields.messages, fields.prompt,
                       fields.completion));
  }
  const ordered_json& prompt = record[fields.prompt];
  const ordered_json& completion = record[fields.completion];
  if (prompt.is_string() && completion.is_string()) {
    // Plain text, as TRL takes it: no template; the tokenizer's BOS first where it has one (TRL encodes
    // with the special tokens), the completion ended by its EOS unless it ends so already.
    const std::string text = prompt.get<std::string>() + completion.get<std::string>();
    example made = labelled(text, {{prompt.get<std::string>().size(), text.size()}}, tokens, loss);
    if (const auto bos = tokens.bos_token_id()) {
      made.ids.insert(made.ids.begin(), *bos);
      made.labels.insert(made.labels.begin(), loss == loss_on::every_token ? *bos : -100);
    }
    if (const auto eos = tokens.eos_token_id(); eos && (made.ids.empty() || made.ids.back() != *eos)) {
      made.ids.push_back(*eos);
      made.labels.push_back(*eos);
    }
    return made;
  }
  const ordered_json prompt_messages = messages_of(prompt, fields, fields.prompt);
  ordered_json messages = prompt_messages;
  for (const ordered_json& message : messages_of(completion, fields, fields.completion)) messages.push_back(message);
  const rendered_chat whole = chat.render(messages, options);
  if (loss == loss_on::every_token) return labelled(whole.text, {}, tokens, loss);
  // The completion's part, what follows the prompt and its generation prompt (TRL's completion-only
  // loss), and within it the generation blocks where the template has them (its assistant-only loss).
  chat_render_options before = options;
  before.add_generation_prompt = true;
  const std::string rendered_prompt = chat.render(prompt_messages, before).text;
  if (!whole.text.starts_with(rendered_prompt)) {
    refuse(
        "the chat template renders the prompt as other than the start of the whole conversation, so the "
        "completion's tokens cannot be told: give the template {% generation %} blocks, or train on every token");
  }
  const byte_range completion_part{rendered_prompt.size(), whole.text.size()};
  if (!chat.has_generation_blocks()) return labelled(whole.text, {completion_part}, tokens, loss);
  std::vector<byte_range> generated;
  for (const auto& [begin, end] : whole.generation) {
    const byte_range kept{std::max(begin, completion_part.first), std::min(end, completion_part.second)};
    if (kept.first < kept.second) generated.push_back(kept);
  }
  return labelled(whole.text, generated, tokens, loss);
}

}  // namespace loom::data
