// loom::data::tokenizer on the texts tokenizer_vs_hf.py gives it:
//   tokenizer-probe DIR TEXTS.json OUT.json   encodes each text of the JSON list with DIR's tokenizer and
//                                             writes {"ids", "offsets", "decoded",
//                                             "decoded_skipping_special", "bos", "eos", "vocab_size"}
//                                             (an "error" string in place of a text's ids where loom
//                                             refuses it, or where encode's ids are not
//                                             encode_with_offsets'; offsets are [begin, end) in bytes)
#include <loom/data/tokenizer.hpp>

#include <nlohmann/json.hpp>

#include <exception>
#include <fstream>
#include <iostream>
#include <stdexcept>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: tokenizer-probe DIR TEXTS.json OUT.json\n";
    return 2;
  }
  try {
    const loom::data::tokenizer tokenizer = loom::data::tokenizer::from_pretrained(argv[1]);
    std::ifstream in(argv[2]);
    const nlohmann::json texts = nlohmann::json::parse(in);
    nlohmann::json out{{"ids", nlohmann::json::array()},
                       {"offsets", nlohmann::json::array()},
                       {"decoded", nlohmann::json::array()},
                       {"decoded_skipping_special", nlohmann::json::array()},
                       {"vocab_size", tokenizer.vocab_size()}};
    out["bos"] = tokenizer.bos_token_id() ? nlohmann::json(*tokenizer.bos_token_id()) : nlohmann::json();
    out["eos"] = tokenizer.eos_token_id() ? nlohmann::json(*tokenizer.eos_token_id()) : nlohmann::json();
    for (const auto& text : texts) {
      try {
        const std::vector<std::int32_t> ids = tokenizer.encode(text.get<std::string>());
        const loom::data::tokenizer::encoding with_offsets = tokenizer.encode_with_offsets(text.get<std::string>());
        if (with_offsets.ids != ids) throw std::logic_error("encode's ids are not encode_with_offsets' ids");
        out["ids"].push_back(ids);
        out["offsets"].push_back(with_offsets.offsets);
        out["decoded"].push_back(tokenizer.decode(ids));
        out["decoded_skipping_special"].push_back(tokenizer.decode(ids, /*skip_special_tokens=*/true));
      } catch (const std::exception& error) {
        out["ids"].push_back(error.what());
        out["offsets"].push_back(nullptr);
        out["decoded"].push_back(nullptr);
        out["decoded_skipping_special"].push_back(nullptr);
      }
    }
    std::ofstream(argv[3]) << out.dump();
  } catch (const std::exception& error) {
    std::cerr << "tokenizer-probe: " << error.what() << '\n';
    return 1;
  }
  return 0;
}
