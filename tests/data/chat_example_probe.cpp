// loom::data::chat_example on the records chat_example_vs_transformers.py gives it:
//   chat-example-probe DIR RECORDS.jsonl [--template FILE] [--fields openai|sharegpt]
//                      [--loss assistant|every_token] [--add-generation-prompt] [--tools JSON]
//                      [--documents JSON] [--variables JSON]
// DIR holds tokenizer.json (and tokenizer_config.json: the BOS, EOS and, without --template, the chat
// template). Each line of RECORDS.jsonl is one record; for each, one JSON line on stdout: {"ids",
// "labels"}, or {"error"} where loom refuses the record. --tools, --documents and --variables are
// JSON texts passed to every render.
#include <loom/data/chat_example.hpp>
#include <loom/data/chat_template.hpp>
#include <loom/data/tokenizer.hpp>

#include <nlohmann/json.hpp>

#include <exception>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

int main(int argc, char** argv) {
  constexpr std::string_view usage =
      "usage: chat-example-probe DIR RECORDS.jsonl [--template FILE] [--fields openai|sharegpt] "
      "[--loss assistant|every_token] [--add-generation-prompt] [--tools JSON] [--documents JSON] "
      "[--variables JSON]\n";
  if (argc < 3) {
    std::cerr << usage;
    return 2;
  }
  using nlohmann::ordered_json;
  try {
    std::optional<std::string> template_path;
    loom::data::chat_fields fields;
    loom::data::loss_on loss = loom::data::loss_on::assistant;
    loom::data::chat_render_options options;
    for (int i = 3; i < argc; ++i) {
      const std::string_view flag = argv[i];
      if (flag == "--add-generation-prompt") {
        options.add_generation_prompt = true;
        continue;
      }
      if (i + 1 == argc) {
        std::cerr << usage;
        return 2;
      }
      const std::string value = argv[++i];
      if (flag == "--template") {
        template_path = value;
      } else if (flag == "--fields" && (value == "openai" || value == "sharegpt")) {
        fields = value == "sharegpt" ? loom::data::chat_fields::sharegpt() : loom::data::chat_fields{};
      } else if (flag == "--loss" && (value == "assistant" || value == "every_token")) {
        loss = value == "assistant" ? loom::data::loss_on::assistant : loom::data::loss_on::every_token;
      } else if (flag == "--tools") {
        options.tools = ordered_json::parse(value);
      } else if (flag == "--documents") {
        options.documents = ordered_json::parse(value);
      } else if (flag == "--variables") {
        options.variables = ordered_json::parse(value);
      } else {
        std::cerr << usage;
        return 2;
      }
    }
    const loom::data::tokenizer tokens = loom::data::tokenizer::from_pretrained(argv[1]);
    loom::data::chat_template chat = [&] {
      if (!template_path) return loom::data::chat_template::from_pretrained(argv[1]);
      std::ifstream file(*template_path, std::ios::binary);
      if (!file) throw std::runtime_error("cannot read " + *template_path);
      return loom::data::chat_template::from_text(
          std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()), *template_path);
    }();

    std::ifstream records(argv[2], std::ios::binary);
    if (!records) throw std::runtime_error(std::string("cannot read ") + argv[2]);
    std::string line;
    while (std::getline(records, line)) {
      if (line.empty()) continue;
      ordered_json out;
      try {
        const loom::data::example made =
            loom::data::chat_example(ordered_json::parse(line), fields, chat, tokens, loss, options);
        out = {{"ids", made.ids}, {"labels", made.labels}};
      } catch (const std::invalid_argument& error) {
        out = {{"error", error.what()}};
      } catch (const loom::data::chat_template_error& error) {
        out = {{"error", error.what()}};
      }
      std::cout << out.dump() << '\n';
    }
  } catch (const std::exception& error) {
    std::cerr << "chat-example-probe: " << error.what() << '\n';
    return 1;
  }
  return 0;
}
