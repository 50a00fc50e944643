// loom::data::chat_template on the conversations chat_template_vs_jinja.py gives it:
//   chat-template-probe TEMPLATE.jinja CASES.json OUT.json
// CASES.json is a list of {"messages", "add_generation_prompt", "tools", "documents", "variables"};
// OUT.json is {"results": [...]} with {"text", "generation": [[begin, end], ...]} (byte offsets) or
// {"error"} for each case, or {"load_error"} where loom refuses the template.
#include <loom/data/chat_template.hpp>

#include <nlohmann/json.hpp>

#include <exception>
#include <fstream>
#include <iostream>
#include <sstream>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: chat-template-probe TEMPLATE.jinja CASES.json OUT.json\n";
    return 2;
  }
  using nlohmann::ordered_json;
  try {
    std::ifstream template_file(argv[1], std::ios::binary);
    std::ostringstream source;
    source << template_file.rdbuf();
    std::ifstream cases_file(argv[2]);
    const ordered_json cases = ordered_json::parse(cases_file);
    ordered_json out = ordered_json::object();
    try {
      const auto chat = loom::data::chat_template::from_text(source.str());
      out["results"] = ordered_json::array();
      for (const ordered_json& one : cases) {
        loom::data::chat_render_options options;
        options.add_generation_prompt = one.value("add_generation_prompt", false);
        options.tools = one.value("tools", ordered_json());
        options.documents = one.value("documents", ordered_json());
        options.variables = one.value("variables", ordered_json::object());
        try {
          const loom::data::rendered_chat rendered = chat.render(one.at("messages"), options);
          out["results"].push_back({{"text", rendered.text}, {"generation", rendered.generation}});
        } catch (const loom::data::chat_template_error& error) {
          out["results"].push_back({{"error", error.what()}});
        }
      }
    } catch (const loom::data::chat_template_error& error) {
      out = {{"load_error", error.what()}};
    }
    std::ofstream(argv[3]) << out.dump();
  } catch (const std::exception& error) {
    std::cerr << "chat-template-probe: " << error.what() << '\n';
    return 1;
  }
  return 0;
}
