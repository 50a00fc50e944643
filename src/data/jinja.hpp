#pragma once
// The Jinja engine behind loom::data::chat_template: the part of Jinja that Hugging Face chat
// templates use, read into a tree once (jinja_parse.cpp) and rendered as Python's jinja2 renders it
// under transformers' settings, with Python's rules for values (jinja_render.cpp).
// Private to the data wing.

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace loom::data::jinja {

// The one way the engine fails: chat_template_error("loom: <template> line <line>: <what>").
[[noreturn]] void fail(std::string_view template_name, int line, std::string_view what);

// ---- values --------------------------------------------------------------------------------------

struct value;
struct statement;
using value_list = std::vector<value>;

// Python's sequences that templates meet: list and tuple print differently, a generator (what
// jinja2's select, map, ... return) is always true and has no length, the dict views print as
// dict_items([...]) and so on.
enum class sequence_kind : std::uint8_t { list, tuple, generator, dict_items, dict_keys, dict_values };

// jinja2's Undefined: empty when printed, false, iterable and empty; an error where it is used as a
// value (attribute, arithmetic, call), the error saying why it is undefined.
struct undefined_value {
  std::string why;
};
struct none_value {};
struct sequence_value {
  std::shared_ptr<const value_list> items;
  sequence_kind kind = sequence_kind::list;
};
struct dict_entries;
struct dict_value {
  std::shared_ptr<const dict_entries> entries;
};
// namespace(...): the one mutable value (`set ns.attr = ...` writes through every copy).
struct namespace_value {
  std::shared_ptr<dict_entries> attributes;
};
struct macro_value {
  const statement* definition = nullptr;
};
// `obj.name` where `name` is one of the object's Python methods: called right after, or only tested.
struct method_value {
  std::shared_ptr<const value> self;
  std::string name;
};
struct loop_state {
  std::shared_ptr<const value_list> items;
  std::size_t index0 = 0;
  std::size_t depth0 = 0;
};
struct loop_value {
  std::shared_ptr<const loop_state> state;
};
enum class builtin_function : std::uint8_t { range, namespace_, dict, raise_exception, strftime_now };
struct function_value {
  builtin_function which;
};

struct value {
  std::variant<undefined_value, none_value, bool, std::int64_t, double, std::string, sequence_value, dict_value,
               namespace_value, macro_value, method_value, loop_value, function_value>
      data;

  value() = default;
  template <class T>
  value(T alternative)  // NOLINT(google-explicit-constructor): values are made from their alternatives
      : data(std::move(alternative)) {}
  value(const char* text) : data(std::string(text)) {}            // NOLINT(google-explicit-constructor)
  value(int number) : data(static_cast<std::int64_t>(number)) {}  // NOLINT(google-explicit-constructor)

  template <class T>
  [[nodiscard]] bool is() const noexcept {
    return std::holds_alternative<T>(data);
  }
  template <class T>
  [[nodiscard]] const T& as() const {
    return std::get<T>(data);
  }
};

// A dict's entries in their order (JSON objects, dict literals); keys are strings.
struct dict_entries {
  std::vector<std::pair<std::string, value>> items;
  [[nodiscard]] const value* find(std::string_view key) const;
  void assign(std::string key, value item);
};

[[nodiscard]] value make_list(value_list items, sequence_kind kind = sequence_kind::list);
[[nodiscard]] value make_dict(dict_entries entries);
// A JSON value as Python's json.loads makes it (objects in their order, integers as int).
[[nodiscard]] value from_json(const nlohmann::ordered_json& json);

// ---- the tree ------------------------------------------------------------------------------------

enum class expression_kind : std::uint8_t {
  literal,      // constant
  name,         // name
  list,         // operands
  tuple,        // operands
  dict,         // operands: key, value, key, value, ...
  attribute,    // operands[0].name
  item,         // operands[0][operands[1]]
  slice,        // operands[0][operands[1]:operands[2]:operands[3]], each bound possibly null
  call,         // operands[0](operands[1...], keywords)
  filter,       // operands[0] | name(operands[1...], keywords)
  test,         // operands[0] is [not] name(operands[1...]); `negated`
  logical_not,  // not operands[0]
  negative,     // -operands[0]
  positive,     // +operands[0]
  arithmetic,   // operands[0] op operands[1]
  compare,      // operands[0] comparisons[0] operands[1] comparisons[1] operands[2] ...
  logical_and,  // operands[0] and operands[1]
  logical_or,   // operands[0] or operands[1]
  conditional,  // operands[0] if operands[1] else operands[2] (possibly null)
  concat,       // operands[0] ~ operands[1] ~ ...
};
enum class arithmetic_operator : std::uint8_t { add, subtract, multiply, divide, floor_divide, modulo, power };
enum class compare_operator : std::uint8_t { equal, not_equal, less, less_equal, greater, greater_equal, in, not_in };

struct expression;
using expression_ptr = std::unique_ptr<expression>;
struct keyword_argument {
  std::string name;
  expression_ptr argument;
};

struct expression {
  expression_kind kind = expression_kind::literal;
  int line = 0;
  value constant;
  std::string name;
  bool negated = false;
  arithmetic_operator arithmetic = arithmetic_operator::add;
  std::vector<compare_operator> comparisons;
  std::vector<expression_ptr> operands;
  std::vector<keyword_argument> keywords;
};

enum class statement_kind : std::uint8_t {
  text,        // text
  output,      // {{ expression }}
  if_block,    // branches (an else is a branch without condition)
  for_loop,    // for targets in expression [if loop_filter] body [else else_body]
  set,         // set targets = expression, or set targets[0].attribute = expression (namespace)
  set_block,   // set targets[0] %} body {% endset
  macro,       // macro text(parameters) body
  loop_break,  // break
  loop_continue,
  generation,  // generation body
};

struct statement;
using statement_ptr = std::unique_ptr<statement>;
using statement_list = std::vector<statement_ptr>;
struct conditional_branch {
  expression_ptr condition;  // null: else
  statement_list body;
};
struct macro_parameter {
  std::string name;
  expression_ptr default_value;  // null: none given
};

struct statement {
  statement_kind kind = statement_kind::text;
  int line = 0;
  std::string text;  // text's text, a macro's name
  expression_ptr expression;
  expression_ptr loop_filter;
  std::vector<conditional_branch> branches;
  statement_list body;
  statement_list else_body;
  std::vector<std::string> targets;
  std::string attribute;
  std::vector<macro_parameter> parameters;
};

struct program {
  std::string name;
  statement_list body;
  bool has_generation = false;
};

// Reads a template (jinja2's lexer with trim_blocks, lstrip_blocks, no trailing newline), refusing
// what the engine does not implement.
[[nodiscard]] program parse(std::string_view source, std::string name);

struct rendering {
  std::string text;
  std::vector<std::pair<std::size_t, std::size_t>> generation;
};
// Renders with these names defined (the builtins range, namespace, dict, raise_exception and
// strftime_now come before them, so a name given here hides one).
[[nodiscard]] rendering render(const program& tree, const std::vector<std::pair<std::string, value>>& names);

// ---- Python's text rules, shared by the lexer and the renderer -----------------------------------

// Python's str.isspace() (and re's \s): the code points that strip(), split() and trim remove.
[[nodiscard]] bool python_space(std::uint32_t code_point);
// Python's str.rstrip() / str.strip() with no argument.
[[nodiscard]] std::string_view python_rstrip(std::string_view text);

// The names the engine implements, for the refusals' "loom supports: ..." and the dispatch.
[[nodiscard]] const std::vector<std::string_view>& supported_filters();
[[nodiscard]] const std::vector<std::string_view>& supported_tests();
[[nodiscard]] const std::vector<std::string_view>& supported_methods();
[[nodiscard]] const std::vector<std::string_view>& supported_functions();

}  // namespace loom::data::jinja
