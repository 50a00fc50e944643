// loom::data::chat_template on the conversations chat_template_vs_jinja.py gives it:
//   chat-template-probe TEMPLATE.jinja CASES.json OUT.json
// CASES.json is a list of {"messages", "add_generation_prompt", "tools", "documents", "variables"},
// each with its own "template" (its text) where TEMPLATE.jinja is "-". OUT.json is a list with, for
// each case, {"text", "generation": [[begin, end], ...]} (byte offsets), {"error"} where the render
// fails or {"load_error"} where loom refuses the template.
#include <loom/data/chat_template.hpp>

#include <nlohmann/json.hpp>

#include <exception>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: chat-template-probe TEMPLATE.jinja CASES.json OUT.json\n";
    return 2;
  }
  using nlohmann::ordered_json;
  try {
    std::string shared_source;
    if (std::string_view(argv[1]) != "-") {
      std::ifstream template_file(argv[1], std::ios::binary);
      std::ostringstream source;
      source << template_file.rdbuf();
      shared_source = source.str();
    }
    std::ifstream cases_file(argv[2]);
    const ordered_json cases = ordered_json::parse(cases_file);
    ordered_json out = ordered_json::array();
    for (const ordered_json& one : cases) {
      std::optional<loom::data::chat_template> chat;
      try {
        chat.emplace(loom::data::chat_template::from_text(one.contains("template") ? one["template"].get<std::string>()
                                                                                   : shared_source));
      } catch (const loom::data::chat_template_error& error) {
        out.push_back({{"load_error", error.what()}});
        continue;
      }
      loom::data::chat_render_options options;
      options.add_generation_prompt = one.value("add_generation_prompt", false);
      options.tools = one.value("tools", ordered_json());
      options.documents = one.value("documents", ordered_json());
      options.variables = one.value("variables", ordered_json::object());
      try {
        const loom::data::rendered_chat rendered = chat->render(one.at("messages"), options);
        out.push_back({{"text", rendered.text}, {"generation", rendered.generation}});
      } catch (const loom::data::chat_template_error& error) {
        out.push_back({{"error", error.what()}});
      }
    }
    std::ofstream(argv[3]) << out.dump();
  } catch (const std::exception& error) {
    std::cerr << "chat-template-probe: " << error.what() << '\n';
    return 1;
  }
  return 0;
}
