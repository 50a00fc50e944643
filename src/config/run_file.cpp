#include <loom/config/run_file.hpp>

#include "fastvideo_layout.hpp"

#include <loom/base/spelling.hpp>
#include <loom/base/text.hpp>
#include <loom/dsl/run_plan.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>
#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <variant>
#include <vector>

namespace loom {
namespace {

using json = nlohmann::ordered_json;

const std::vector<std::string> lora_keys{"rank",    "alpha",      "dropout",      "targets",       "patterns",
                                         "exclude", "use_rslora", "rank_pattern", "alpha_pattern", "modules_to_save"};

// Names as people spell them: "DDP" and "ddp", PEFT's "All-Linear" and "all-linear".
std::string lowercase(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

// The objects of a run file beside its plan, each read through its options struct's fields().
constexpr std::array<std::string_view, 7> sections{"train", "flow_matching", "ema", "sampling",
                                                   "data",  "optimizer",     "chat"};

const std::vector<std::string> stage_names{
    "seeded",          "default_dtype", "pretrained", "quantized", "mixed_precision", "recompute", "sequence_parallel",
    "tensor_parallel", "lora",          "trainable",  "strategy"};

// Calls each(std::type_identity<S>{}) for each strategy stage S a run file can name (run_strategy's).
template <class F>
void for_each_strategy(F&& each) {
  [&]<class... S>(std::type_identity<std::variant<S...>>) {
    (each(std::type_identity<S>{}), ...);
  }(std::type_identity<run_strategy>{});
}

// local, ddp, fsdp
std::vector<std::string> strategy_names() {
  std::vector<std::string> names;
  for_each_strategy([&]<class S>(std::type_identity<S>) { names.emplace_back(S::name); });
  return names;
}

// The fields an options struct describes, by name.
// The value type of an optional field (clip_norm, lr), else the type itself.
template <class T>
struct optional_of {
  using type = T;
};
template <class T>
struct optional_of<std::optional<T>> {
  using type = T;
};
template <class T>
constexpr bool is_optional = !std::is_same_v<T, typename optional_of<T>::type>;

template <class Options>
std::vector<std::string> field_names() {
  std::vector<std::string> keys;
  std::apply([&](const auto&... field) { (keys.emplace_back(field.name), ...); }, Options::fields());
  return keys;
}

// The keys of a strategy's object: its name, and the fields its options struct describes.
template <class Stage>
std::vector<std::string> strategy_keys() {
  std::vector<std::string> keys{"name"};
  if constexpr (requires { typename Stage::options_type; }) {
    for (std::string& key : field_names<typename Stage::options_type>()) keys.push_back(std::move(key));
  }
  return keys;
}

// Every key of `Options` as `prefix`.key, and the keys of the options objects within it
// ("train.lr.peak").
template <class Options>
void add_dotted_keys(std::vector<std::string>& keys, const std::string& prefix) {
  const auto add = [&](const auto& field) {
    using value_type = std::remove_cvref_t<decltype(std::declval<Options&>().*(field.member))>;
    using inner = typename optional_of<value_type>::type;
    const std::string key = prefix + "." + std::string(field.name);
    keys.push_back(key);
    if constexpr (described_options<inner>) add_dotted_keys<inner>(keys, key);
  };
  std::apply([&](const auto&... field) { (add(field), ...); }, Options::fields());
}

// Every key a run file takes in loom's layout, dotted as an override names it ("seeded", "lora.rank",
// "strategy.bucket_cap_mb", "train.lr.peak"): what a key the reader does not know is compared with.
const std::vector<std::string>& run_file_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> all = stage_names;
    add_dotted_keys<quantized_options>(all, "quantized");
    add_dotted_keys<mixed_precision_options>(all, "mixed_precision");
    add_dotted_keys<recompute_options>(all, "recompute");
    add_dotted_keys<sequence_parallel_options>(all, "sequence_parallel");
    add_dotted_keys<tensor_parallel_options>(all, "tensor_parallel");
    for (const std::string& key : lora_keys) all.push_back("lora." + key);
    for_each_strategy([&]<class S>(std::type_identity<S>) {
      for (const std::string& key : strategy_keys<S>()) all.push_back("strategy." + key);
    });
    add_dotted_keys<train_options>(all, "train");
    add_dotted_keys<flow_matching_options>(all, "flow_matching");
    add_dotted_keys<ema_options>(all, "ema");
    add_dotted_keys<flow_euler_sampler_options>(all, "sampling");
    add_dotted_keys<run_data_options>(all, "data");
    add_dotted_keys<adamw_run_options>(all, "optimizer");
    add_dotted_keys<data::chat_options>(all, "chat");
    return all;
  }();
  return keys;
}

// "fp32, bf16, ...": the dtypes a run file can name.
std::string dtype_list() {
  std::vector<std::string_view> names;
  for (const dtype_name& entry : dtype_names) names.push_back(entry.short_name);
  return fmt::format("{}", fmt::join(names, ", "));
}

// A rule's sentence in a run file's words: an option as C++ spells it (".param = loom::bf16",
// ".every = 1") as a run file writes it ("param = \"bf16\"", "every = 1").
std::string in_run_file_words(const std::string& sentence) {
  static const std::regex dtype(R"(loom::(bf16|fp16|fp32|fp64))");
  static const std::regex field(R"( \.([a-z_]+) )");
  return std::regex_replace(std::regex_replace(sentence, dtype, "\"$1\""), field, " $1 ");
}

// Where each key of a run file was written: "lora.rank", "strategy.name", "train.lr.peak", "plan[2]"
// (a stage's keys are named after the stage, as the messages name them).
using source_lines = std::map<std::string, std::int64_t>;

std::string joined(const std::string& prefix, std::string_view key) {
  return prefix.empty() ? std::string(key) : prefix + "." + std::string(key);
}

// A TOML document as the JSON tree the reader checks, noting each key's line. `path` names `node`;
// the entries of the top-level "plan" list are named plan[i], and their stages by their own names.
json from_toml(const toml::node& node, const std::string& path, source_lines& lines) {
  if (const auto line = node.source().begin.line; line > 0) lines.emplace(path, line);
  if (const toml::table* table = node.as_table()) {
    json object = json::object();
    for (const auto& [key, value] : *table) {
      object[std::string(key.str())] = from_toml(value, joined(path == "plan" ? "" : path, key.str()), lines);
    }
    return object;
  }
  if (const toml::array* array = node.as_array()) {
    json list = json::array();
    for (std::size_t i = 0; i < array->size(); ++i) {
      const std::string item = path == "plan" ? fmt::format("plan[{}]", i) : fmt::format("{}[{}]", path, i);
      if (path == "plan") lines.emplace(item, (*array)[i].source().begin.line);
      list.push_back(from_toml((*array)[i], path == "plan" ? "plan" : item, lines));
    }
    return list;
  }
  if (const auto* value = node.as_integer()) {  // as JSON reads them: unsigned when not negative
    return value->get() >= 0 ? json(static_cast<std::uint64_t>(value->get())) : json(value->get());
  }
  if (const auto* value = node.as_floating_point()) return value->get();
  if (const auto* value = node.as_boolean()) return value->get();
  if (const auto* value = node.as_string()) return value->get();
  return nullptr;  // a date or a time: no key takes one, so its key's check rejects it
}

// A YAML scalar as JSON reads its spelling: a plain (unquoted) one is null, a boolean, a whole number
// or a number when YAML 1.2's core schema says so, else a string; a quoted one is always a string.
json yaml_scalar(const YAML::Node& node) {
  const std::string& text = node.Scalar();
  if (node.Tag() != "?") return text;  // quoted ("!"), or tagged
  if (text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL") return nullptr;
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  const char* begin = text.data();
  const char* end = begin + text.size();
  if (std::uint64_t whole = 0; std::from_chars(begin, end, whole).ptr == end) return whole;
  if (std::int64_t negative = 0; std::from_chars(begin, end, negative).ptr == end) return negative;
  if (double number = 0; std::from_chars(begin, end, number).ptr == end && std::isfinite(number)) return number;
  return text;
}

// A YAML document as the JSON tree the reader checks, noting each key's line, as from_toml does.
json from_yaml(const YAML::Node& node, const std::string& path, source_lines& lines) {
  if (const int line = node.Mark().line; line >= 0) lines.emplace(path, line + 1);
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      json object = json::object();
      for (const auto& entry : node) {
        const std::string key = entry.first.Scalar();
        const std::string child = joined(path == "plan" ? "" : path, key);
        object[key] = from_yaml(entry.second, child, lines);
        lines.insert_or_assign(child, entry.first.Mark().line + 1);  // the key's line: a block value starts below it
      }
      return object;
    }
    case YAML::NodeType::Sequence: {
      json list = json::array();
      for (std::size_t i = 0; i < node.size(); ++i) {
        const std::string item = path == "plan" ? fmt::format("plan[{}]", i) : fmt::format("{}[{}]", path, i);
        if (path == "plan") lines.emplace(item, node[i].Mark().line + 1);
        list.push_back(from_yaml(node[i], path == "plan" ? "plan" : item, lines));
      }
      return list;
    }
    case YAML::NodeType::Scalar: return yaml_scalar(node);
    default: return nullptr;
  }
}

// The line of the first byte outside ASCII that is not in a comment line. toml++ 3.3 (Debian 12's)
// reaches undefined behaviour classifying such a character wherever its lexer meets one outside a
// string, and its lexer's idea of "outside a string" in an invalid file is its own (tests/fuzz
// found three ways), so the rule loom checks is simple: outside ASCII only in lines that are
// comments; a string spells such a character \uXXXX.
std::optional<std::int64_t> non_ascii_outside_comment_lines(std::string_view text) {
  std::int64_t line = 1;
  bool comment_line = false;
  bool line_start = true;  // nothing but spaces and tabs so far on this line
  for (const char c : text) {
    if (c == '\n') {
      ++line;
      comment_line = false;
      line_start = true;
      continue;
    }
    if (line_start && c == '#') comment_line = true;
    if (c != ' ' && c != '\t') line_start = false;
    if (static_cast<unsigned char>(c) >= 0x80 && !comment_line) return line;
  }
  return std::nullopt;
}

class reader final : public config_detail::fastvideo_reader {
 public:
  explicit reader(std::filesystem::path path) : path_(std::move(path)) {}

  // Names the file, the key's line where the file gave the key (TOML), the key and the problem.
  // Names the key as the user wrote it: an override's as given (the command line's, not the file's),
  // a key of FastVideo's layout in FastVideo's spelling, with the line it is on.
  [[noreturn]] void fail(const std::string& key, const std::string& problem) const override {
    throw_error<run_file_error>("{}: {}", located(key), problem);
  }

  // Where `key` was written: "run file 'x.yaml', line 7: models.transformer.lora" (and the overrides
  // that set keys within it), or "the override lora.rnak=4 (over run file 'x.yaml'): lora.rnak".
  [[nodiscard]] std::string located(const std::string& key) const {
    const std::string written = as_written(key);
    for (const auto& [given, text] : overrides_) {
      for (const std::string& spelling : {key, written}) {
        if (!key.empty() && (spelling == given || spelling.starts_with(given + "."))) {
          return fmt::format("the override {} (over run file '{}'): {}", text, path_.string(), spelling);
        }
      }
    }
    // A stage of the file that overrides changed: "models.transformer.lora (with the override ...rank=0)".
    std::vector<std::string> within;
    for (const auto& [given, text] : overrides_) {
      if (!key.empty() && (given.starts_with(key + ".") || given.starts_with(written + "."))) within.push_back(text);
    }
    const auto line = lines_.find(key);
    return fmt::format(
        "run file '{}'{}{}{}", path_.string(), line == lines_.end() ? "" : fmt::format(", line {}", line->second),
        written.empty() ? "" : ": " + written,
        within.empty()
            ? ""
            : fmt::format(" (with the override{} {})", within.size() > 1 ? "s" : "", fmt::join(within, ", ")));
  }

  // `key` (loom's spelling) as the file writes it: FastVideo's `training.steps` for `train.steps`.
  [[nodiscard]] std::string as_written(std::string key) const {
    for (auto it = spellings_.rbegin(); it != spellings_.rend(); ++it) {
      const auto& [loom_key, file_key] = *it;
      if (key == loom_key || key.starts_with(loom_key + ".")) key = file_key + key.substr(loom_key.size());
    }
    return key;
  }

  // The file as a JSON tree: TOML (with each key's line noted) or JSON, by its extension.
  json load() {
    std::ifstream in(path_, std::ios::binary);
    if (!in) fail("", "it cannot be read");
    const std::string extension = path_.extension().string();
    if (extension == ".toml") {
      const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      if (const auto line = non_ascii_outside_comment_lines(text)) {
        fail("", fmt::format("line {}: a character outside ASCII; loom reads TOML run files in ASCII outside "
                             "comment lines: write it as \\uXXXX in a \"string\" (or use a JSON run file)",
                             *line));
      }
      try {
        return from_toml(toml::parse(text, path_.string()), "", lines_);
      } catch (const toml::parse_error& error) {
        fail("", fmt::format("line {}: it is not TOML ({})", error.source().begin.line, error.description()));
      }
    }
    if (extension == ".yaml" || extension == ".yml") {
      const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      try {
        // Translated from FastVideo's layout once the overrides in its spelling are in (apply_overrides).
        fastvideo_layout_ = true;
        return from_yaml(YAML::Load(text), "", lines_);
      } catch (const YAML::Exception& error) {
        fail("", fmt::format("line {}: it is not YAML ({})", error.mark.line + 1, error.msg));
      }
    }
    if (extension != ".json") fail("", "give a run file named *.toml, *.yaml or *.json");
    try {
      return json::parse(in);
    } catch (const json::exception& error) {  // a syntax error, or a number too large for any type
      fail("", fmt::format("it is not JSON ({})", error.what()));
    }
  }

  // What the reader noticed and accepted (run_file::notes).
  [[nodiscard]] std::vector<std::string> take_notes() { return std::move(notes_); }
  [[nodiscard]] const std::optional<ranks_asked>& ranks() const noexcept { return ranks_; }

 private:
  void note(const std::string& text) override {
    notes_.push_back(fmt::format("run file '{}': {}", path_.string(), text));
  }

  void require_ranks(int ranks, const std::string& key, const std::string& asked_by,
                     const std::string& sizes) override {
    ranks_ = ranks_asked{ranks, fmt::format("{}: {}", located(key), asked_by), sizes};
  }

  // The lines noted for `from` and its keys, now under `to`, and `from` the spelling messages use.
  void move_lines(const std::string& from, const std::string& to) override {
    spellings_.emplace_back(to, from);
    source_lines moved;
    for (auto it = lines_.begin(); it != lines_.end();) {
      if (it->first == from || it->first.starts_with(from + ".")) {
        moved.emplace(to + it->first.substr(from.size()), it->second);
        it = lines_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& entry : moved) lines_.insert_or_assign(entry.first, entry.second);
  }

 public:
  // Applies each override, in order, to the file's tree: "train.<key>=value" to its "train" object,
  // "flow_matching.<key>=value", "ema.<key>=value", "sampling.<key>=value", "data.<key>=value",
  // "optimizer.<key>=value" and "chat.<key>=value" to their objects, the others to its "plan" list
  // ("lora.rank=16", "strategy=fsdp", "seeded=7"). The value is JSON when it parses as JSON, a string
  // otherwise.
  //
  // A YAML file also takes keys in FastVideo's spelling ("training.distributed.sp_size=2",
  // "models.transformer.lora.rank=32", "callbacks.ema.decay=0.999"), set where the file would write them before its
  // layout is translated, so that they are checked as the file's own keys are.
  void apply_overrides(json& root, std::span<const std::string> overrides) {
    std::vector<std::pair<std::string, json>> in_loom_spelling;
    for (const std::string& text : overrides) {
      auto [key, value] = parsed_override(text);
      if (!key.starts_with("training.") && !key.starts_with("models.") && !key.starts_with("callbacks.") &&
          !key.starts_with("pipeline.") && !key.starts_with("method.")) {
        in_loom_spelling.emplace_back(std::move(key), std::move(value));
        continue;
      }
      if (!fastvideo_layout_) {
        fail(key, fmt::format("{} is FastVideo's spelling, which YAML run files take; this run file is in loom's: "
                              "override loom's key (train.steps for training.steps, lora.rank for "
                              "models.transformer.lora.rank; docs/run_files.md)",
                              key.substr(0, key.find('.'))));
      }
      forget_line(key);
      set_written_key(root, key, std::move(value));
    }
    if (fastvideo_layout_) config_detail::translate_fastvideo(root, *this);
    check_top_level(root);
    for (auto& override_ : in_loom_spelling) {
      const std::string& key = override_.first;  // not a structured binding: the lambda below captures it
      json& value = override_.second;
      forget_line(key);  // where the translation put it
      if (const auto section =
              std::find_if(sections.begin(), sections.end(),
                           [&](std::string_view name) { return key.starts_with(std::string(name) + "."); });
          section != sections.end()) {
        set_section_key(root, std::string(*section), key, std::move(value));
      } else {
        set_stage_key(root, key, std::move(value));
      }
    }
  }

  run_stages stages(const json& root) const {
    const json list = root.contains("plan") ? root["plan"] : json::array();
    check_plan(list);
    run_stages result;
    for (std::size_t i = 0; i < list.size(); ++i) {
      const json& entry = list[i];
      const std::string where = fmt::format("plan[{}]", i);
      if (!entry.is_object() || entry.size() != 1) {
        fail(where, fmt::format("give one stage as {{\"name\": value}}, name one of {}", fmt::join(stage_names, ", ")));
      }
      const std::string name = entry.begin().key();
      const json& value = entry.begin().value();
      try {
        add_stage(result, where, name, value);
      } catch (const plan_error& broken) {
        throw plan_error(broken.code(), located(name) + ": " + in_run_file_words(broken.what()));
      }
    }
    return result;
  }

 private:
  // One stage of the plan, its values checked.
  void add_stage(run_stages& result, const std::string& where, const std::string& name, const json& value) const {
    if (name == "strategy") {
      run_strategy chosen = strategy(value);
      result.kinds.push_back(std::visit([](const auto& stage) { return stage.kind; }, chosen));
      if (!result.strategy) result.strategy = chosen;
      return;
    }
    plan_stage stage = plan_stage_from(where, name, value);
    result.kinds.push_back(std::visit([](const auto& each) { return each.kind; }, stage));
    result.stages.add(std::move(stage));
  }

  // A stage between the model and the strategy, from its run-file value.
  plan_stage plan_stage_from(const std::string& where, const std::string& name, const json& value) const {
    if (name == "seeded") {
      if (!value.is_number_unsigned()) fail(name, "give the seed as a whole number, e.g. \"seeded\": 42");
      return seeded(value.get<std::uint64_t>());
    }
    if (name == "default_dtype") return default_dtype_stage::checked(type_of(name, value));
    if (name == "mixed_precision") {
      if (!value.is_object())
        fail(name, "give {\"param\": \"bf16\", \"reduce\": \"fp32\"} (any of them may be left out)");
      require_keys(name, field_names<mixed_precision_options>(), value, name);
      return mixed_precision_stage::checked(fields<mixed_precision_options>(value, name));
    }
    if (name == "pretrained") {
      if (!value.is_string()) fail(name, "give the checkpoint's folder or .safetensors file as a string");
      return pretrained_stage::checked(value.get<std::string>());
    }
    if (name == "quantized") {
      if (!value.is_object()) fail(name, "give {\"format\": \"nf4\"} (or \"fp8\") to hold the frozen base quantized");
      require_keys(name, field_names<quantized_options>(), value, name);
      return quantized_stage::checked(fields<quantized_options>(value, name));
    }
    if (name == "quantization_config") return quantized_from_bitsandbytes(value);
    if (name == "recompute") {
      if (!value.is_object()) fail(name, "give {\"every\": 1} to recompute every unit, or k for every k-th one");
      require_keys(name, field_names<recompute_options>(), value, name);
      return recompute_stage::checked(fields<recompute_options>(value, name));
    }
    if (name == "sequence_parallel") {
      if (!value.is_object()) fail(name, "give {\"size\": 2} to split each sequence across 2 ranks");
      require_keys(name, field_names<sequence_parallel_options>(), value, name);
      return sequence_parallel_stage::checked(fields<sequence_parallel_options>(value, name));
    }
    if (name == "tensor_parallel") {
      if (!value.is_object()) fail(name, "give {\"size\": 2} to split each layer across 2 ranks");
      require_keys(name, field_names<tensor_parallel_options>(), value, name);
      return tensor_parallel_stage::checked(fields<tensor_parallel_options>(value, name));
    }
    if (name == "lora") return lora(value);
    if (name == "trainable") return trainable_stage::checked(targets("trainable", value, false));
    fail(where, fmt::format("unknown stage '{}'; the stages after the model are {}{}", name,
                            fmt::join(stage_names, ", "), did_you_mean(name, run_file_keys())));
  }

  // transformers' BitsAndBytesConfig, as a PEFT or FastVideo user's config gives it (QLoRA's
  // load_in_4bit with bnb_4bit_quant_type "nf4"): quantized(nf4) with its double quantization.
  quantized_stage quantized_from_bitsandbytes(const json& value) const {
    const std::string name = "quantization_config";
    if (!value.is_object()) {
      fail(name,
           "give transformers' BitsAndBytesConfig keys, e.g. {\"load_in_4bit\": true, "
           "\"bnb_4bit_quant_type\": \"nf4\", \"bnb_4bit_use_double_quant\": true}");
    }
    require_keys(name,
                 {"quant_method", "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type", "bnb_4bit_use_double_quant",
                  "bnb_4bit_compute_dtype", "bnb_4bit_quant_storage"},
                 value, name);
    const auto text = [&](const char* key) { return value[key].is_string() ? value[key].get<std::string>() : ""; };
    if (value.contains("quant_method") && text("quant_method") != "bitsandbytes")
      fail(name + ".quant_method", "loom reads bitsandbytes' settings: give \"bitsandbytes\", or use quantized");
    if (value.contains("load_in_8bit") && boolean(name + ".load_in_8bit", value["load_in_8bit"]))
      fail(name + ".load_in_8bit",
           "LLM.int8() is not one of loom's formats: give load_in_4bit (nf4), or "
           "quantized = {format = \"fp8\"} for an 8-bit base");
    if (!value.contains("load_in_4bit") || !boolean(name + ".load_in_4bit", value["load_in_4bit"]))
      fail(name + ".load_in_4bit", "give true: loom quantizes the base to 4 bits as bitsandbytes' nf4");
    quantized_options options{.format = quantized_format::nf4};
    if (value.contains("bnb_4bit_quant_type") && text("bnb_4bit_quant_type") != "nf4")
      fail(name + ".bnb_4bit_quant_type", "give \"nf4\", the one 4-bit type loom has (QLoRA's; not \"fp4\")");
    if (value.contains("bnb_4bit_use_double_quant"))
      options.double_quant = boolean(name + ".bnb_4bit_use_double_quant", value["bnb_4bit_use_double_quant"]);
    if (value.contains("bnb_4bit_compute_dtype")) {
      // loom computes in the activations' dtype (mixed_precision's param), which this names.
      if (!is_floating(type_of(name + ".bnb_4bit_compute_dtype", value["bnb_4bit_compute_dtype"])))
        fail(name + ".bnb_4bit_compute_dtype", "give a floating dtype, e.g. \"bfloat16\"");
    }
    if (value.contains("bnb_4bit_quant_storage") && text("bnb_4bit_quant_storage") != "uint8")
      fail(name + ".bnb_4bit_quant_storage", "give \"uint8\": loom holds the codes as bytes");
    return quantized_stage::checked(options);
  }

  // A list of names (or regexes), where PEFT's "all-linear" (in any case, as PEFT reads it) is
  // loom::all_linear, alone or as the whole value.
  target_list targets(const std::string& key, const json& value, bool patterns) const {
    const auto named = [&](const std::string& text) {
      if (!patterns && lowercase(text) == all_linear.text) return all_linear;
      return patterns ? pattern(text) : target(text);
    };
    if (value.is_string() && !patterns) return target_list{named(value.get<std::string>())};
    if (!value.is_array()) fail(key, "give a list of strings, e.g. [\"q_proj\", \"v_proj\"]");
    target_list list;
    for (const json& item : value) {
      if (!item.is_string()) fail(key, "give a list of strings, e.g. [\"q_proj\", \"v_proj\"]");
      list.push_back(named(item.get<std::string>()));
    }
    return list;
  }

  // PEFT's {"q_proj": 16, "layers\\.0\\..*": 4}, in the file's order (the first key that matches wins).
  lora_pattern_list pattern_values(const std::string& key, const json& value) const {
    if (!value.is_object()) fail(key, "give an object of a module name or regex to a number, e.g. {\"q_proj\": 16}");
    lora_pattern_list list;
    for (const auto& [pattern_key, number_value] : value.items()) {
      list.push_back({pattern_key, number<double>(key + "." + pattern_key, number_value, false)});
    }
    return list;
  }

  // The keys of `value` are all `stage`'s, named as `prefix`.key in the message.
  void require_keys(std::string_view stage, const std::vector<std::string>& keys, const json& value,
                    const std::string& prefix) const override {
    for (const auto& [key, ignored] : value.items()) {
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
        fail(prefix + "." + key,
             fmt::format("unknown key; {} takes {}{}", stage, fmt::join(keys, ", "), did_you_mean(key, keys)));
      }
    }
  }

  // `or_none`: the key is optional, and its messages offer "none", which read_field takes.
  template <class T>
  T number(const std::string& key, const json& value, bool whole, bool or_none = false) const {
    if (!value.is_number() || (whole && !value.is_number_integer())) {
      fail(key, fmt::format("give a {}{}", whole ? "whole number" : "number", or_none ? ", or none" : ""));
    }
    if (std::is_unsigned_v<T> && !value.is_number_unsigned()) fail(key, "give a whole number, 0 or more");
    return value.get<T>();
  }

  // "bf16" or PyTorch's "bfloat16"; whether the dtype suits the key is the DSL's rule to say.
  dtype type_of(const std::string& key, const json& value, bool or_none = false) const {
    const std::optional<dtype> named =
        value.is_string() ? dtype_named(value.get<std::string>()) : std::optional<dtype>();
    if (!named)
      fail(key, fmt::format("give a dtype as a string, one of {}{}", dtype_list(), or_none ? ", or none" : ""));
    return *named;
  }

  bool boolean(const std::string& key, const json& value) const override {
    if (!value.is_boolean()) fail(key, "give true or false");
    return value.get<bool>();
  }

  lora_stage lora(const json& value) const {
    if (!value.is_object()) fail("lora", "give {\"rank\": 8, \"targets\": [\"q_proj\", \"v_proj\"], ...}");
    require_keys("lora", lora_keys, value, "lora");
    if (!value.contains("rank")) fail("lora.rank", "missing; give the adapters' rank, e.g. 8");
    lora_options options;
    if (value.contains("alpha")) options.alpha = number<double>("lora.alpha", value["alpha"], false);
    if (value.contains("dropout")) options.dropout = number<double>("lora.dropout", value["dropout"], false);
    if (value.contains("exclude")) options.exclude = targets("lora.exclude", value["exclude"], false);
    if (value.contains("use_rslora")) options.use_rslora = boolean("lora.use_rslora", value["use_rslora"]);
    if (value.contains("modules_to_save")) {
      options.modules_to_save = targets("lora.modules_to_save", value["modules_to_save"], false);
    }
    if (value.contains("rank_pattern"))
      options.rank_pattern = pattern_values("lora.rank_pattern", value["rank_pattern"]);
    if (value.contains("alpha_pattern")) {
      options.alpha_pattern = pattern_values("lora.alpha_pattern", value["alpha_pattern"]);
    }
    target_list chosen = default_targets;
    if (value.contains("targets") || value.contains("patterns")) {
      chosen = value.contains("targets") ? targets("lora.targets", value["targets"], false) : target_list{};
      if (value.contains("patterns")) {
        for (const target& p : targets("lora.patterns", value["patterns"], true)) chosen.push_back(p);
      }
    }
    return lora_stage::checked(number<int>("lora.rank", value["rank"], true), chosen, options);
  }

  run_strategy strategy(const json& value) const {
    std::string name;
    if (value.is_string()) {
      name = value.get<std::string>();
    } else if (value.is_object() && value.contains("name") && value["name"].is_string()) {
      name = value["name"].get<std::string>();
    } else {
      fail("strategy",
           fmt::format("give a name ({}) or {{\"name\": \"ddp\", options...}}", fmt::join(strategy_names(), ", ")));
    }
    name = lowercase(name);
    const json options = value.is_object() ? value : json::object();
    const std::optional<run_strategy> chosen = strategy_named(std::type_identity<run_strategy>{}, name, options);
    if (!chosen) {
      fail("strategy", fmt::format("unknown strategy '{}'; the strategies are {}{}", name,
                                   fmt::join(strategy_names(), ", "), did_you_mean(name, strategy_names())));
    }
    return *chosen;
  }

  // The strategy among `Stages` called `name`, with `options`; none when no stage has that name.
  template <class... Stages>
  std::optional<run_strategy> strategy_named(std::type_identity<std::variant<Stages...>>, const std::string& name,
                                             const json& options) const {
    std::optional<run_strategy> chosen;
    ((Stages::name == name ? (void)(chosen = strategy_from<Stages>(name, options)) : void()), ...);
    return chosen;
  }

  template <class Stage>
  Stage strategy_from(const std::string& name, const json& options) const {
    require_keys(name, strategy_keys<Stage>(), options, "strategy");
    if constexpr (requires { typename Stage::options_type; }) {
      return Stage(fields<typename Stage::options_type>(options, "strategy"));
    } else {
      return Stage{};
    }
  }

  // An options struct from the keys of `object` that name its fields (the others keep their defaults).
  template <class Options>
  Options fields(const json& object, const std::string& prefix) const {
    Options options;
    std::apply([&](const auto&... field) { (read_field(options.*field.member, field.name, object, prefix), ...); },
               Options::fields());
    return options;
  }

  template <class T>
  void read_field(T& target, std::string_view name, const json& object, const std::string& prefix) const {
    const std::string key(name);
    if (!object.contains(key)) return;
    const std::string where = prefix + "." + key;
    const json& value = object[key];
    if constexpr (is_optional<T>) {
      // As the C++ default leaves it: "none" in any layout (an override's --train.clip_norm=none),
      // or the file's own null (JSON's null, YAML's ~; TOML has none).
      if (value.is_null() || value == "none") {
        target = std::nullopt;
        return;
      }
    }
    if constexpr (std::is_same_v<T, bool>) {
      target = boolean(where, value);
    } else if constexpr (std::is_same_v<T, dtype> || std::is_same_v<T, std::optional<dtype>>) {
      target = type_of(where, value, is_optional<T>);
    } else if constexpr (requires { values_of(std::type_identity<T>{}); }) {
      // An enumeration a run file names by its values' names (quantized's format, "nf4").
      const std::string text = value.is_string() ? value.get<std::string>() : "";
      std::vector<std::string> names;
      for (const T each : values_of(std::type_identity<T>{})) {
        if (name_of(each) == text) {
          target = each;
          return;
        }
        names.emplace_back(name_of(each));
      }
      fail(where, fmt::format("give one of \"{}\"{}", fmt::join(names, "\", \""), did_you_mean(text, names)));
    } else if constexpr (std::is_same_v<typename optional_of<T>::type, std::filesystem::path>) {
      if (!value.is_string()) fail(where, "give a path as a string");
      target = value.get<std::string>();
    } else if constexpr (std::is_same_v<T, decay_shape>) {
      const std::string shape = value.is_string() ? value.get<std::string>() : "";
      if (shape != "linear" && shape != "cosine") fail(where, "give \"linear\" or \"cosine\"");
      target = shape == "linear" ? decay_shape::linear : decay_shape::cosine;
    } else if constexpr (std::is_same_v<T, nonfinite_policy>) {
      const std::optional<nonfinite_policy> policy =
          value.is_string() ? nonfinite_policy_named(value.get<std::string>()) : std::nullopt;
      if (!policy) fail(where, "give \"stop\" or \"skip\"");
      target = *policy;
    } else if constexpr (std::is_same_v<T, timestep_density>) {
      const std::optional<timestep_density> density =
          value.is_string() ? timestep_density_named(value.get<std::string>()) : std::nullopt;
      if (!density) fail(where, "give \"uniform\", \"logit_normal\" or \"mode\"");
      target = *density;
    } else if constexpr (described_options<T> || described_options<typename optional_of<T>::type>) {
      // An object of options within: its own keys, its own fields.
      using inner = std::conditional_t<described_options<T>, T, typename optional_of<T>::type>;
      if (!value.is_object())
        fail(where, fmt::format("give an object of {}, e.g. {{\"{}\": ...}}", fmt::join(field_names<inner>(), ", "),
                                field_names<inner>().front()));
      require_keys(name, field_names<inner>(), value, where);
      target = fields<inner>(value, where);
    } else {
      using number_type = typename optional_of<T>::type;
      target = number<number_type>(where, value, std::is_integral_v<number_type>, is_optional<T>);
    }
  }

  // KEY=VALUE's key, and its value: JSON when it parses as JSON, a string otherwise. Messages about
  // the key name the override as given.
  std::pair<std::string, json> parsed_override(const std::string& text) {
    const auto equals = text.find('=');
    if (equals == std::string::npos || equals == 0) {
      fail(text, "an override is KEY=VALUE, for example lora.rank=16, strategy=fsdp or train.steps=100");
    }
    std::string key = text.substr(0, equals);
    const std::string raw = text.substr(equals + 1);
    overrides_.insert_or_assign(key, text);
    json value = json::parse(raw, nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded()) value = raw;
    return {std::move(key), std::move(value)};
  }

  // A key in the file's own layout, "training.distributed.sp_size": each part an object's key.
  void set_written_key(json& root, const std::string& key, json value) const {
    json* at = &root;
    std::string path;
    for (std::size_t start = 0;;) {
      const auto dot = key.find('.', start);
      const std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (at->is_null()) *at = json::object();
      if (!at->is_object()) fail(path, "is not an object in the run file, so the override cannot set a key in it");
      path += (path.empty() ? "" : ".") + part;
      at = &(*at)[part];
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    *at = std::move(value);
  }

  // An override of a stage's key: "lora.rank" sets a key of the file's lora stage, "strategy=fsdp" or
  // "seeded=7" replaces the stage (or adds it).
  void set_stage_key(json& root, const std::string& key, json value) const {
    json& stages = root["plan"];
    if (stages.is_null()) stages = json::array();
    check_plan(stages);
    const auto dot = key.find('.');
    const std::string stage = key.substr(0, dot);
    if (std::find(stage_names.begin(), stage_names.end(), stage) == stage_names.end()) {
      fail(key, fmt::format("unknown key; an override names a stage, a stage's key or a key of train, "
                            "flow_matching, ema, sampling, data, optimizer or chat, as docs/run_files.md lists them{}",
                            did_you_mean(key, run_file_keys())));
    }
    json* entry = nullptr;
    for (json& each : stages) {
      if (each.is_object() && each.contains(stage)) entry = &each[stage];
    }
    if (entry == nullptr) {
      if (dot != std::string::npos) fail(key, fmt::format("the run file has no {} stage to set it in", stage));
      // Where the rules want it: before the first stage that comes after it in a plan.
      const auto later = std::find_if(stages.begin(), stages.end(), [&](const json& each) {
        return each.is_object() && each.size() == 1 && plan_position(each.begin().key()) > plan_position(stage);
      });
      stages.insert(later, json{{stage, std::move(value)}});
      return;
    }
    if (dot == std::string::npos) {
      // strategy=fsdp names another strategy: its options start from the defaults.
      *entry = std::move(value);
      return;
    }
    if (entry->is_string()) *entry = json{{"name", *entry}};  // "strategy": "ddp" gains options
    if (!entry->is_object()) fail(key, fmt::format("{} is not an object in the run file", stage));
    (*entry)[key.substr(dot + 1)] = std::move(value);
  }

  // An override of a section's key: "train.lr.peak=3e-4" sets train.lr.peak.
  void set_section_key(json& root, const std::string& section, const std::string& key, json value) const {
    json* at = &root[section];
    if (at->is_null()) *at = json::object();
    std::string path = section;
    std::string rest = key.substr(path.size() + 1);
    for (auto dot = rest.find('.'); dot != std::string::npos; dot = rest.find('.')) {
      if (!at->is_object()) fail(path, "give an object here, e.g. {\"steps\": 800}");
      path.append(".").append(rest, 0, dot);
      at = &(*at)[rest.substr(0, dot)];
      if (at->is_null()) *at = json::object();
      rest = rest.substr(dot + 1);
    }
    if (!at->is_object()) fail(path, "give an object here, e.g. {\"steps\": 800}");
    // A schedule length given on the command line replaces the file's, in whichever spelling the file
    // has it (steps or a fraction of the run): the two together would be refused.
    if (path == "train.lr") {
      for (const auto& [one, other] :
           {std::pair{"warmup_steps", "warmup_ratio"}, std::pair{"decay_steps", "decay_ratio"}}) {
        if (rest == one) at->erase(other);
        if (rest == other) at->erase(one);
      }
    }
    (*at)[rest] = std::move(value);
  }

  void check_plan(const json& list) const override {
    if (!list.is_array()) fail("plan", "give a list of stages, each {\"name\": value}");
  }

  void check_top_level(const json& root) const {
    if (!root.is_object()) fail("", "it is not a JSON object; give {\"plan\": [stages...], \"train\": {...}}");
    for (const auto& [key, value] : root.items()) {
      if (key != "plan" && std::find(sections.begin(), sections.end(), key) == sections.end()) {
        std::vector<std::string> known{"plan"};
        known.insert(known.end(), run_file_keys().begin(), run_file_keys().end());
        fail(key, fmt::format("unknown key; a run file has \"plan\", \"train\", \"flow_matching\", \"ema\", "
                              "\"sampling\", \"data\", \"optimizer\" and \"chat\" (a YAML one may have "
                              "FastVideo's \"models\", \"method\", \"training\", \"callbacks\" and \"pipeline\" "
                              "instead){}",
                              did_you_mean(key, known)));
      }
    }
  }

 public:
  // The loop's options from the tree's "train" object.
  train_options training(const json& root) const {
    // A file without "train" (and no train.* override) leaves the loop's options to the program.
    if (!root.contains("train")) return {};
    const json& train = root["train"];
    if (!train.is_object()) fail("train", "give the loop's options as an object, e.g. {\"steps\": 800}");
    require_keys("train", field_names<train_options>(), train, "train");
    train_options options = fields<train_options>(train, "train");
    if (options.lr) options.lr->total_steps = options.steps;
    // What train() would refuse after the model is built is refused now, before anything is.
    if (!train.contains("steps")) fail("train.steps", "missing; give the number of optimizer steps, e.g. 300");
    if (const auto& lr = options.lr; lr && !lr->warmup_ratio && !lr->decay_ratio && lr->warmup_steps >= 0 &&
                                     lr->decay_steps >= 0 && options.steps > 0 &&
                                     lr->warmup_steps + lr->decay_steps > options.steps) {
      // Most often train.steps lowered by an override: the lengths that keep their proportions, and
      // the keys that would have scaled by themselves.
      const std::int64_t lengths = lr->warmup_steps + lr->decay_steps;
      fail("train.lr",
           fmt::format("warmup_steps ({}) and decay_steps ({}) add up to more than train.steps ({}); give lengths "
                       "that fit, e.g. --train.lr.warmup_steps={} --train.lr.decay_steps={} (the same proportions), "
                       "or write them in the run file as fractions of train.steps, which scale with it "
                       "(train.lr.warmup_ratio, train.lr.decay_ratio)",
                       lr->warmup_steps, lr->decay_steps, options.steps, lr->warmup_steps * options.steps / lengths,
                       lr->decay_steps * options.steps / lengths));
    }
    if (const auto found = train_options_problem(options)) fail("train." + found->option, found->problem);
    return options;
  }

  // The options of the tree's object `name`, if it has one, each checked by the struct's problem():
  // a flow-matching recipe's ("flow_matching"), the weights' average ("ema").
  template <class Options>
  std::optional<Options> checked_section(const json& root, const std::string& name, std::string_view example) const {
    if (!root.contains(name)) return std::nullopt;
    const json& value = root[name];
    if (!value.is_object()) fail(name, fmt::format("give its options as an object, e.g. {}", example));
    require_keys(name, field_names<Options>(), value, name);
    const Options options = fields<Options>(value, name);
    if (const auto found = options.problem()) fail(name + "." + found->option, found->problem);
    return options;
  }

  // An instruction-tuning recipe's options from the tree's "chat" object, if it has one.
  std::optional<data::chat_options> chat(const json& root) const {
    if (!root.contains("chat")) return std::nullopt;
    const json& value = root["chat"];
    if (!value.is_object()) fail("chat", "give its options as an object, e.g. {\"packing\": true}");
    require_keys("chat", field_names<data::chat_options>(), value, "chat");
    const data::chat_options options = fields<data::chat_options>(value, "chat");
    if (options.pack_window < 1) {
      fail("chat.pack_window", fmt::format("is {}; give the number of records first-fit decreasing packs together, at "
                                           "least 1 ({} by default)",
                                           options.pack_window, data::chat_options{}.pack_window));
    }
    return options;
  }

 private:
  // A key set by an override is no longer the file's: its messages name no line.
  void forget_line(const std::string& key) {
    std::erase_if(lines_, [&](const auto& entry) { return entry.first == key || entry.first.starts_with(key + "."); });
  }

  std::filesystem::path path_;
  source_lines lines_;
  std::map<std::string, std::string> overrides_;                // each override's key, and it as given
  bool fastvideo_layout_ = false;                               // a YAML file, translated after its overrides
  std::vector<std::pair<std::string, std::string>> spellings_;  // loom's key, and the file's (move_lines)
  std::vector<std::string> notes_;
  std::optional<ranks_asked> ranks_;
};

}  // namespace

run_file read_run_file(const std::filesystem::path& path, std::span<const std::string> overrides) {
  reader file(path);
  json root = file.load();
  file.apply_overrides(root, overrides);
  run_file read{
      file.stages(root),
      file.training(root),
      file.checked_section<flow_matching_options>(root, "flow_matching", R"({"weighting_scheme": "logit_normal"})"),
      file.checked_section<ema_options>(root, "ema", R"({"decay": 0.999})"),
      file.checked_section<flow_euler_sampler_options>(root, "sampling", R"({"num_inference_steps": 50})"),
      file.checked_section<run_data_options>(root, "data", R"({"path": "clips/", "batch_size": 1})"),
      file.checked_section<adamw_run_options>(root, "optimizer", R"({"weight_decay": 0.01})"),
      file.chat(root),
      file.ranks(),
      {},
      {},
      file.take_notes()};
  // A group size k > 1, which the job's ranks must be a multiple of, in the file's words for its key.
  const auto group = [&file](std::size_t size, const std::string& key) -> std::optional<ranks_asked> {
    if (size <= 1) return std::nullopt;
    return ranks_asked{static_cast<int>(std::min<std::size_t>(size, std::numeric_limits<int>::max())),
                       file.located(key), file.as_written(key)};
  };
  if (const auto split = read.stages.stages.find<sequence_parallel_stage>())
    read.sequence_group = group(split->settings().size, "sequence_parallel.size");
  if (const auto split = read.stages.stages.find<tensor_parallel_stage>())
    read.tensor_group = group(split->settings().size, "tensor_parallel.size");
  return read;
}

std::optional<option_problem> run_data_options::problem() const {
  if (path && path->empty())
    return option_problem{"path", "is empty; give the folder the recipe reads its examples from"};
  if (batch_size && *batch_size < 1)
    return option_problem{"batch_size",
                          fmt::format("is {}; give the examples per rank and micro-batch, 1 or more", *batch_size)};
  return std::nullopt;
}

std::optional<option_problem> adamw_run_options::problem() const {
  // torch's AdamW checks the same ranges, once the model is built; a run file hears of them first.
  for (const auto& [name, beta] : {std::pair{"beta1", beta1}, std::pair{"beta2", beta2}}) {
    if (!(beta >= 0.0 && beta < 1.0)) return option_problem{name, fmt::format("is {}; give a beta in [0, 1)", beta)};
  }
  if (!(eps >= 0.0)) return option_problem{"eps", fmt::format("is {}; give a non-negative epsilon, e.g. 1e-8", eps)};
  if (!(weight_decay >= 0.0))
    return option_problem{"weight_decay", fmt::format("is {}; give a non-negative decay, e.g. 0.01", weight_decay)};
  return std::nullopt;
}

void check_world_size(const run_file& file, int world_size) {
  if (file.ranks && file.ranks->ranks != world_size) {
    throw_error<run_file_error>("{} asks for {} ranks, but the job has {}: launch {} ranks, or make {} {}",
                                file.ranks->asked_by, file.ranks->ranks, world_size, file.ranks->ranks,
                                file.ranks->sizes, world_size);
  }
  if (file.sequence_group && world_size % file.sequence_group->ranks != 0) {
    throw_error<run_file_error>(
        "{}: sequence_parallel splits each sequence over {} ranks, which does not divide the job's {}: launch a "
        "multiple of {} ranks, or make {} a divisor of {}",
        file.sequence_group->asked_by, file.sequence_group->ranks, world_size, file.sequence_group->ranks,
        file.sequence_group->sizes, world_size);
  }
  if (file.tensor_group && world_size % file.tensor_group->ranks != 0) {
    throw_error<run_file_error>(
        "{}: tensor_parallel splits each layer over {} ranks, which does not divide the job's {}: launch a "
        "multiple of {} ranks, or make {} a divisor of {}",
        file.tensor_group->asked_by, file.tensor_group->ranks, world_size, file.tensor_group->ranks,
        file.tensor_group->sizes, world_size);
  }
}

run_stages read_run_stages(const std::filesystem::path& path, std::span<const std::string> overrides) {
  reader file(path);
  json root = file.load();
  file.apply_overrides(root, overrides);
  return file.stages(root);
}

train_options read_train_options(const std::filesystem::path& path, std::span<const std::string> overrides) {
  reader file(path);
  json root = file.load();
  file.apply_overrides(root, overrides);
  return file.training(root);
}

}  // namespace loom
