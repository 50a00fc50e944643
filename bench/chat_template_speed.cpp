// loom::data::chat_template's render, timed, for bench/chat_template_speed:
//   chat-template-speed TEMPLATE.jinja CONVERSATIONS.json PASSES
// renders every conversation of CONVERSATIONS.json ({"variables": {...}, "conversations": [[messages]]})
// with add_generation_prompt, PASSES times over on this thread, and prints
// {"impl": "loom", "conversations", "bytes", "seconds": [one pass's, ...]}.
#include <loom/data/chat_template.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <exception>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 4) {
    fmt::print(stderr, "usage: chat-template-speed TEMPLATE.jinja CONVERSATIONS.json PASSES\n");
    return 2;
  }
  try {
    std::ifstream template_file(argv[1], std::ios::binary);
    const auto chat = loom::data::chat_template::from_text(
        std::string{std::istreambuf_iterator<char>(template_file), std::istreambuf_iterator<char>()});
    std::ifstream input(argv[2]);
    const auto given = nlohmann::ordered_json::parse(input);
    loom::data::chat_render_options options;
    options.add_generation_prompt = true;
    options.variables = given["variables"];
    std::vector<double> seconds;
    std::size_t bytes = 0;
    for (int pass = 0; pass < std::stoi(argv[3]); ++pass) {
      bytes = 0;
      const auto start = std::chrono::steady_clock::now();
      for (const auto& conversation : given["conversations"]) bytes += chat.render(conversation, options).text.size();
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    fmt::print("{{\"impl\": \"loom\", \"conversations\": {}, \"bytes\": {}, \"seconds\": [{:.6f}]}}\n",
               given["conversations"].size(), bytes, fmt::join(seconds, ", "));
  } catch (const std::exception& error) {
    fmt::print(stderr, "chat-template-speed: {}\n", error.what());
    return 1;
  }
  return 0;
}
