// libFuzzer target: the chat template engine (src/data/chat_template.cpp, jinja_parse, jinja_render).
// The input is a template's text; each must be read or refused with chat_template_error, nothing else,
// and a template that is read must render a fixed conversation (system, user, assistant with a tool
// call, tool, user) with the generation prompt, or refuse it with chat_template_error.
#include <loom/data/chat_template.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const nlohmann::ordered_json conversation = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "caf\u00e9 \u4f60\u597d \ud83d\ude00"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
      "function": {"name": "weather", "arguments": {"city": "Paris", "days": 2}}}]},
    {"role": "tool", "content": "{\"sunny\": true}"},
    {"role": "user", "content": ""}])");
  try {
    const auto chat = loom::data::chat_template::from_text(std::string(reinterpret_cast<const char*>(data), size));
    loom::data::chat_render_options options;
    options.add_generation_prompt = true;
    options.variables = {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"enable_thinking", false}};
    (void)chat.render(conversation, options);
  } catch (const loom::data::chat_template_error&) {
  }
  return 0;
}
