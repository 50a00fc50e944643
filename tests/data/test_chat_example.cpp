// loom::data::chat_example over a tokenizer of bytes (one token a byte, so a token's labels are its
// byte's): the assistant's bytes labelled and nothing else, found by {% generation %} blocks and by
// rendering prefixes; ShareGPT's and TRL's shapes; every token; and each refusal's sentence.
#include "byte_tokenizer.hpp"
#include "scratch_folder.hpp"

#include <loom/data/chat_example.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <string>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using nlohmann::ordered_json;

namespace {

// ChatML, as Qwen2.5 writes it, without and with generation blocks around the assistant's part.
constexpr const char* chatml =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
constexpr const char* chatml_generation =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}<|im_end|>{% endgeneration %}"
    "{% else %}{{ m.content }}<|im_end|>{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

loom::data::tokenizer bytes() {
  const loom::testing::scratch_folder folder;
  return loom::testing::byte_tokenizer(folder.path());
}

// The labelled bytes, as text: what the loss is on.
std::string labelled_text(const loom::data::example& e) {
  std::string text;
  for (const std::int32_t label : e.labels) {
    if (label >= 2) text += static_cast<char>(label - 2);
    if (label == 1) text += "</s>";
  }
  return text;
}

const ordered_json conversation = ordered_json::parse(R"({"messages": [
  {"role": "system", "content": "Be brief."},
  {"role": "user", "content": "Hi"},
  {"role": "assistant", "content": "Hello!"},
  {"role": "user", "content": "Bye"},
  {"role": "assistant", "content": "Ciao ✓"}]})");

}  // namespace

TEST_CASE("the assistant's tokens carry the loss, by rendered prefixes or by generation blocks", "[chat]") {
  const loom::data::tokenizer tokens = bytes();
  for (const char* source : {chatml, chatml_generation}) {
    CAPTURE(source);
    const auto chat = loom::data::chat_template::from_text(source);
    const loom::data::example e = loom::data::chat_example(conversation, {}, chat, tokens);
    REQUIRE(e.ids.size() == e.labels.size());
    // By prefixes the part is what follows the generation prompt, its line's end included.
    CHECK(labelled_text(e) ==
          (chat.has_generation_blocks() ? "Hello!<|im_end|>Ciao ✓<|im_end|>" : "Hello!<|im_end|>\nCiao ✓<|im_end|>\n"));
    const loom::data::example every =
        loom::data::chat_example(conversation, {}, chat, tokens, loom::data::loss_on::every_token);
    CHECK(every.labels == every.ids);
  }
}

TEST_CASE("ShareGPT's conversations and TRL's prompt and completion", "[chat]") {
  const loom::data::tokenizer tokens = bytes();
  const auto chat = loom::data::chat_template::from_text(chatml);
  const ordered_json sharegpt =
      ordered_json::parse(R"({"conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}]})");
  const loom::data::example shared =
      loom::data::chat_example(sharegpt, loom::data::chat_fields::sharegpt(), chat, tokens);
  CHECK(labelled_text(shared) == "4<|im_end|>\n");

  const ordered_json plain = ordered_json::parse(R"({"prompt": "The sky is", "completion": " blue."})");
  const loom::data::example text = loom::data::chat_example(plain, {}, chat, tokens);
  CHECK(labelled_text(text) == " blue.</s>");
  CHECK(text.ids.back() == 1);
  // A completion that ends with the EOS already gets no second one, as TRL's.
  const ordered_json ended = ordered_json::parse(R"({"prompt": "Q", "completion": " A</s>"})");
  const loom::data::example once = loom::data::chat_example(ended, {}, chat, tokens);
  CHECK(labelled_text(once) == " A</s>");
  CHECK(std::count(once.ids.begin(), once.ids.end(), 1) == 1);

  const ordered_json conversational = ordered_json::parse(
      R"({"prompt": [{"role": "user", "content": "Name a colour"}], "completion": [{"role": "assistant", "content": "Red"}]})");
  CHECK(labelled_text(loom::data::chat_example(conversational, {}, chat, tokens)) == "Red<|im_end|>\n");
  // With generation blocks, only the completion's: not the prompt's assistant turns (TRL's completion-only loss).
  const auto generating = loom::data::chat_template::from_text(chatml_generation);
  const ordered_json turns = ordered_json::parse(R"({"prompt": [{"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}],
    "completion": [{"role": "assistant", "content": "Ciao"}]})");
  CHECK(labelled_text(loom::data::chat_example(turns, {}, generating, tokens)) == "Ciao<|im_end|>");
}

TEST_CASE("records and templates that cannot be labelled are refused in a sentence", "[chat][errors]") {
  const loom::data::tokenizer tokens = bytes();
  const auto chat = loom::data::chat_template::from_text(chatml);
  CHECK_THROWS_WITH(loom::data::chat_example(ordered_json::parse(R"({"text": "x"})"), {}, chat, tokens),
                    ContainsSubstring("the record has neither 'messages' nor both 'prompt' and 'completion'"));
  CHECK_THROWS_WITH(
      loom::data::chat_example(ordered_json::parse(R"({"messages": [{"role": "narrator", "content": "x"}]})"), {}, chat,
                               tokens),
      ContainsSubstring("its 'messages' message 0 has the role 'narrator', which is none of"));
  CHECK_THROWS_WITH(loom::data::chat_example(ordered_json::parse(R"({"messages": "hi"})"), {}, chat, tokens),
                    ContainsSubstring("its 'messages' is not a list of messages"));
  // A template that shows only the last message rewrites the earlier turns.
  const auto last_only =
      loom::data::chat_template::from_text("{{ messages[-1].content }}{% if add_generation_prompt %}>{% endif %}");
  CHECK_THROWS_WITH(loom::data::chat_example(conversation, {}, last_only, tokens),
                    ContainsSubstring("renders the conversation up to message 2 (an assistant's) as other than the "
                                      "start of the whole"));
}
