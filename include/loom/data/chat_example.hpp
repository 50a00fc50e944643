#pragma once
// One record of an instruction-tuning dataset made into a training example (docs/data.md, "Chat
// data"): its conversation rendered with the model's chat template, tokenized, and labelled where the
// loss goes, as TRL's SFTTrainer labels it with assistant_only_loss (or completion_only_loss).
//
// Records come in the shapes people store them: OpenAI's {"messages": [{"role", "content", ...}]},
// ShareGPT's {"conversations": [{"from": "human" | "gpt" | "system", "value"}]} (chat_fields::sharegpt()),
// and TRL's {"prompt", "completion"}, each a string (plain text, no template: the tokenizer's BOS
// first where it has one, the completion and its EOS, appended unless it ends with it, carry the loss)
// or a list of messages (the completion's part after the rendered prompt and its generation prompt
// carries it, within the template's {% generation %} blocks where it has them). The assistant's
// tokens of a conversation are found by those blocks (transformers' return_assistant_tokens_mask),
// else by rendering the conversation up to each assistant message: what that message adds after the
// generation prompt is its part (its end-of-turn marker included). A token is labelled when any of its
// bytes is: one that spans a prompt's end and a completion's start carries the loss, where TRL, which
// counts the prompt's tokens, leaves it out.

#include <loom/data/chat_template.hpp>
#include <loom/data/packing.hpp>
#include <loom/data/tokenizer.hpp>

#include <nlohmann/json.hpp>

#include <array>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>

namespace loom::data {

// How a record names its parts; the defaults are OpenAI's and TRL's.
struct chat_fields {
  std::string messages = "messages";
  std::string role = "role";
  std::string content = "content";
  std::string prompt = "prompt";
  std::string completion = "completion";
  // A record's roles as the template knows them; a role not listed is refused, naming it.
  std::map<std::string, std::string> roles{{"system", "system"}, {"user", "user"},       {"assistant", "assistant"},
                                           {"tool", "tool"},     {"human", "user"},      {"gpt", "assistant"},
                                           {"function", "tool"}, {"observation", "tool"}};

  // ShareGPT's: "conversations", "from", "value".
  [[nodiscard]] static chat_fields sharegpt();
};

// Where the loss goes.
enum class loss_on { assistant, every_token };
// "assistant" and "every_token": how run files and messages name them.
[[nodiscard]] std::string_view name_of(loss_on loss) noexcept;
constexpr std::array<loss_on, 2> values_of(std::type_identity<loss_on>) noexcept {
  return {loss_on::assistant, loss_on::every_token};
}

// The tokens of `record` and their labels: its assistant's (or completion's) tokens labelled with
// themselves, the others -100; every token under loss_on::every_token. std::invalid_argument, in one
// sentence naming the field or the message, for a record of another shape, a role the fields do not
// map, or a template that renders the conversation up to an assistant message as other than the
// start of the whole (it rewrites earlier turns: give it {% generation %} blocks, or train on every
// token).
[[nodiscard]] example chat_example(const nlohmann::ordered_json& record, const chat_fields& fields,
                                   const chat_template& chat, const tokenizer& tokens,
                                   loss_on loss = loss_on::assistant, const chat_render_options& options = {});

}  // namespace loom::data
