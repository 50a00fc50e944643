// The template's text read into loom::data::jinja's tree: jinja2's lexer under transformers' settings
// (trim_blocks, lstrip_blocks, one trailing newline dropped) and jinja2's grammar for the statements
// and expressions chat templates use. Whatever else a template uses is refused here, naming it and
// its line, so that a template that loads renders with no construct missing.
#include "jinja.hpp"
#include "utf8.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::data::jinja {
namespace {

enum class token_kind : std::uint8_t {
  data,
  variable_begin,
  variable_end,
  block_begin,
  block_end,
  name,
  string,
  integer,
  floating,
  op,
  end_of_input
};

struct token {
  token_kind kind = token_kind::end_of_input;
  int line = 0;
  std::string text;  // data, name, operator; a string literal unescaped
  std::int64_t integer = 0;
  double floating = 0;
};

std::string describe(const token& t) {
  switch (t.kind) {
    case token_kind::data: return "template text";
    case token_kind::variable_begin: return "'{{'";
    case token_kind::variable_end: return "'}}'";
    case token_kind::block_begin: return "'{%'";
    case token_kind::block_end: return "'%}'";
    case token_kind::name:
    case token_kind::op: return "'" + t.text + "'";
    case token_kind::string: return "a string";
    case token_kind::integer:
    case token_kind::floating: return "a number";
    case token_kind::end_of_input: return "the end of the template";
  }
  return "?";
}

std::string supported(const std::vector<std::string_view>& names) {
  std::string text;
  for (const std::string_view name : names) text.append(text.empty() ? "" : ", ").append(name);
  return text;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

// The Python whitespace at `at`, if any: its length in bytes.
std::size_t space_at(std::string_view text, std::size_t at) {
  const auto byte = static_cast<unsigned char>(text[at]);
  if (byte < 0x80) return python_space(byte) ? 1 : 0;
  if (detail::invalid_utf8_at(text.substr(at, std::min<std::size_t>(4, text.size() - at))) == std::size_t{0}) return 0;
  const auto [code_point, length] = detail::code_point_at(text, at);
  return python_space(code_point) ? length : 0;
}

bool all_space(std::string_view text) {
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t length = space_at(text, at);
    if (length == 0) return false;
    at += length;
  }
  return true;
}

int newlines(std::string_view text) { return static_cast<int>(std::count(text.begin(), text.end(), '\n')); }

// jinja2's lexer, with trim_blocks and lstrip_blocks on and keep_trailing_newline off.
class lexer {
 public:
  lexer(std::string_view raw, const std::string& name) : name_(name) {
    // Every line break is "\n" (jinja2 splits on \r\n, \r and \n), and one at the very end is dropped.
    source_.reserve(raw.size());
    for (std::size_t at = 0; at < raw.size(); ++at) {
      if (raw[at] == '\r') {
        source_ += '\n';
        if (at + 1 < raw.size() && raw[at + 1] == '\n') ++at;
      } else {
        source_ += raw[at];
      }
    }
    if (!source_.empty() && source_.back() == '\n') source_.pop_back();
  }

  std::vector<token> tokens() {
    while (at_ < source_.size()) {
      const std::size_t open = next_opener();
      if (open == std::string::npos) {
        emit_data(std::string_view(source_).substr(at_));
        break;
      }
      const char opener = source_[open + 1];
      std::size_t after = open + 2;
      char sign = 0;
      if (after < source_.size() && (source_[after] == '-' || source_[after] == '+')) sign = source_[after++];

      std::string_view text = std::string_view(source_).substr(at_, open - at_);
      const int text_lines = newlines(text);
      if (sign == '-') {
        text = python_rstrip(text);
      } else if (sign != '+' && opener != '{') {
        // lstrip_blocks: the spaces between a line's start and a block or comment tag go.
        const std::size_t line_start = text.rfind('\n') == std::string_view::npos ? 0 : text.rfind('\n') + 1;
        if ((line_start > 0 || line_starting_) && line_start < text.size() && all_space(text.substr(line_start))) {
          text = text.substr(0, line_start);
        }
      }
      emit_data(text, text_lines);
      at_ = after;
      if (opener == '#') {
        skip_comment();
      } else {
        lex_tag(opener == '%');
      }
    }
    tokens_.push_back(token{token_kind::end_of_input, line_, {}, 0, 0});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(std::string_view what) const { fail(name_, line_, what); }

  std::size_t next_opener() const {
    for (std::size_t at = source_.find('{', at_); at != std::string::npos; at = source_.find('{', at + 1)) {
      if (at + 1 < source_.size() && (source_[at + 1] == '{' || source_[at + 1] == '%' || source_[at + 1] == '#')) {
        return at;
      }
    }
    return std::string::npos;
  }

  void emit_data(std::string_view text, int text_lines) {
    if (!text.empty()) tokens_.push_back(token{token_kind::data, line_, std::string(text), 0, 0});
    line_ += text_lines;
  }
  void emit_data(std::string_view text) { emit_data(text, newlines(text)); }

  // After "-%}", "-}}" or "-#}": all whitespace that follows, newlines included.
  void skip_spaces_after_end() {
    const std::size_t start = at_;
    for (std::size_t length; at_ < source_.size() && (length = space_at(source_, at_)) > 0;) at_ += length;
    const std::string_view skipped = std::string_view(source_).substr(start, at_ - start);
    line_ += newlines(skipped);
    line_starting_ = !skipped.empty() && skipped.back() == '\n';
  }

  // trim_blocks: one newline right after "%}" or "#}" goes.
  void skip_newline_after_end() {
    line_starting_ = at_ < source_.size() && source_[at_] == '\n';
    if (line_starting_) {
      ++at_;
      ++line_;
    }
  }

  void skip_comment() {
    const int opened_at = line_;
    for (std::size_t at = at_; at < source_.size(); ++at) {
      const std::string_view rest = std::string_view(source_).substr(at);
      const bool plus = rest.starts_with("+#}");
      const bool minus = rest.starts_with("-#}");
      if (!plus && !minus && !rest.starts_with("#}")) continue;
      line_ += newlines(std::string_view(source_).substr(at_, at - at_));
      at_ = at + (plus || minus ? 3 : 2);
      line_starting_ = false;
      if (minus) {
        skip_spaces_after_end();
      } else if (!plus) {
        skip_newline_after_end();
      }
      return;
    }
    fail(name_, opened_at, "a comment is not closed ('#}' is missing)");
  }

  void lex_tag(bool block) {
    const int opened_at = line_;
    tokens_.push_back(token{block ? token_kind::block_begin : token_kind::variable_begin, line_, {}, 0, 0});
    if (block) refuse_raw();
    std::vector<char> closers;
    while (true) {
      if (at_ >= source_.size()) {
        fail(name_, opened_at,
             block ? "a tag is not closed ('%}' is missing)" : "a tag is not closed ('}}' is missing)");
      }
      const std::string_view rest = std::string_view(source_).substr(at_);
      if (closers.empty() && end_of_tag(rest, block)) return;
      if (const std::size_t length = space_at(source_, at_); length > 0) {
        if (source_[at_] == '\n') ++line_;
        at_ += length;
        continue;
      }
      if (lex_number(rest) || lex_name(rest) || lex_string(rest)) continue;
      lex_operator(rest, closers);
    }
  }

  bool end_of_tag(std::string_view rest, bool block) {
    const std::string_view close = block ? "%}" : "}}";
    const token end{block ? token_kind::block_end : token_kind::variable_end, line_, {}, 0, 0};
    if (block && rest.starts_with("+%}")) {
      tokens_.push_back(end);
      at_ += 3;
      line_starting_ = false;
      return true;
    }
    if (rest.size() >= 3 && rest[0] == '-' && rest.substr(1, 2) == close) {
      tokens_.push_back(end);
      at_ += 3;
      skip_spaces_after_end();
      return true;
    }
    if (rest.starts_with(close)) {
      tokens_.push_back(end);
      at_ += 2;
      line_starting_ = false;
      if (block) skip_newline_after_end();
      return true;
    }
    return false;
  }

  // {% raw %} would need a lexer state of its own; no chat template uses it.
  void refuse_raw() const {
    std::size_t at = at_;
    while (at < source_.size() && space_at(source_, at) > 0) at += space_at(source_, at);
    if (std::string_view(source_).substr(at).starts_with("raw") &&
        (at + 3 >= source_.size() || !is_name_char(source_[at + 3]))) {
      error(fmt::format("the tag 'raw' is not supported; loom supports: {}",
                        "for, if, set, macro, break, continue, generation"));
    }
  }

  static std::size_t digits(std::string_view text, std::size_t at, bool (*digit)(char)) {
    // (\d+_)*\d+ : digits, single underscores between them
    std::size_t end = at;
    while (end < text.size() && digit(text[end])) {
      ++end;
      if (end + 1 < text.size() && text[end] == '_' && digit(text[end + 1])) ++end;
    }
    return end;
  }

  bool lex_number(std::string_view rest) {
    if (rest.empty() || !is_digit(rest[0])) return false;
    const bool after_dot = at_ > 0 && source_[at_ - 1] == '.';
    std::size_t end = digits(rest, 0, is_digit);
    // jinja2's float: digits, then a fraction, an exponent or both (not right after a '.').
    std::size_t float_end = 0;
    if (!after_dot) {
      std::size_t at = end;
      if (at + 1 < rest.size() && rest[at] == '.' && is_digit(rest[at + 1])) at = digits(rest, at + 1, is_digit);
      std::size_t with_exponent = 0;
      if (at < rest.size() && (rest[at] == 'e' || rest[at] == 'E')) {
        std::size_t exponent = at + 1;
        if (exponent < rest.size() && (rest[exponent] == '+' || rest[exponent] == '-')) ++exponent;
        if (exponent < rest.size() && is_digit(rest[exponent])) with_exponent = digits(rest, exponent, is_digit);
      }
      if (with_exponent > 0) {
        float_end = with_exponent;
      } else if (at > end) {
        float_end = at;
      }
    }
    if (float_end > 0) {
      std::string text;
      for (const char c : rest.substr(0, float_end)) {
        if (c != '_') text += c;
      }
      token t{token_kind::floating, line_, text, 0, 0};
      const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), t.floating);
      if (ec != std::errc{} || ptr != text.data() + text.size()) error("the number '" + text + "' cannot be read");
      tokens_.push_back(std::move(t));
      at_ += float_end;
      return true;
    }
    int base = 10;
    std::size_t start = 0;
    if (rest[0] == '0' && rest.size() > 2) {
      const char prefix = static_cast<char>(rest[1] | 0x20);
      const auto binary = [](char c) { return c == '0' || c == '1'; };
      const auto octal = [](char c) { return c >= '0' && c <= '7'; };
      const auto hex = [](char c) { return is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); };
      bool (*digit)(char) = nullptr;
      if (prefix == 'b') digit = binary, base = 2;
      if (prefix == 'o') digit = octal, base = 8;
      if (prefix == 'x') digit = hex, base = 16;
      if (digit != nullptr) {
        std::size_t at = 2;
        while (at < rest.size() &&
               (digit(rest[at]) || (rest[at] == '_' && at + 1 < rest.size() && digit(rest[at + 1])))) {
          ++at;
        }
        if (at > 2) {
          start = 2;
          end = at;
        } else {
          base = 10;
        }
      }
    }
    if (base == 10 && rest[0] == '0') {
      end = 1;  // "0(_?0)*": a decimal number starts with 1-9 or is zero
      while (end < rest.size() &&
             (rest[end] == '0' || (rest[end] == '_' && end + 1 < rest.size() && rest[end + 1] == '0'))) {
        ++end;
      }
    }
    std::string text;
    for (const char c : rest.substr(start, end - start)) {
      if (c != '_') text += c;
    }
    token t{token_kind::integer, line_, std::string(rest.substr(0, end)), 0, 0};
    const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), t.integer, base);
    if (ec != std::errc{} || ptr != text.data() + text.size()) {
      error("the integer '" + t.text + "' does not fit in 64 bits");
    }
    tokens_.push_back(std::move(t));
    at_ += end;
    return true;
  }

  bool lex_name(std::string_view rest) {
    if (!is_name_start(rest[0])) return false;
    std::size_t end = 1;
    while (end < rest.size() && is_name_char(rest[end])) ++end;
    tokens_.push_back(token{token_kind::name, line_, std::string(rest.substr(0, end)), 0, 0});
    at_ += end;
    return true;
  }

  static int hex_value(char c) {
    if (is_digit(c)) return c - '0';
    c = static_cast<char>(c | 0x20);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  }

  // A string literal's escapes as Python's "unicode-escape" codec reads them (jinja2 decodes the
  // literal's text with it).
  bool lex_string(std::string_view rest) {
    const char quote = rest[0];
    if (quote != '\'' && quote != '"') return false;
    std::size_t end = 1;
    while (end < rest.size() && rest[end] != quote) end += rest[end] == '\\' ? 2 : 1;
    if (end >= rest.size()) error("a string is not closed");
    const std::string_view body = rest.substr(1, end - 1);
    std::string text;
    for (std::size_t at = 0; at < body.size(); ++at) {
      if (body[at] != '\\') {
        text += body[at];
        continue;
      }
      const char next = body[++at];
      const auto read_hex = [&](std::size_t count, std::string_view escape) {
        std::uint32_t code_point = 0;
        for (std::size_t k = 1; k <= count; ++k) {
          const int digit = at + k < body.size() ? hex_value(body[at + k]) : -1;
          if (digit < 0) error(fmt::format("a string has a truncated \\{} escape", escape));
          code_point = code_point * 16 + static_cast<std::uint32_t>(digit);
        }
        if (code_point > 0x10FFFF || (code_point >= 0xD800 && code_point <= 0xDFFF)) {
          error(fmt::format("a string's \\{} escape is no Unicode scalar value", escape));
        }
        detail::append_utf8(text, code_point);
        at += count;
      };
      switch (next) {
        case '\n': break;
        case '\\': text += '\\'; break;
        case '\'': text += '\''; break;
        case '"': text += '"'; break;
        case 'a': text += '\a'; break;
        case 'b': text += '\b'; break;
        case 'f': text += '\f'; break;
        case 'n': text += '\n'; break;
        case 'r': text += '\r'; break;
        case 't': text += '\t'; break;
        case 'v': text += '\v'; break;
        case 'x': read_hex(2, "x"); break;
        case 'u': read_hex(4, "u"); break;
        case 'U': read_hex(8, "U"); break;
        case 'N': error("a string's \\N{...} escape is not supported"); break;
        default:
          if (next >= '0' && next <= '7') {
            std::uint32_t code_point = 0;
            std::size_t count = 0;
            while (count < 3 && at + count < body.size() && body[at + count] >= '0' && body[at + count] <= '7') {
              code_point = code_point * 8 + static_cast<std::uint32_t>(body[at + count] - '0');
              ++count;
            }
            detail::append_utf8(text, code_point);
            at += count - 1;
          } else if (static_cast<unsigned char>(next) >= 0x80) {
            // jinja2 first writes the character as Python's backslashreplace escape, which the
            // backslash before it then leaves as text.
            const auto [code_point, length] = detail::code_point_at(body, at);
            text += '\\';
            text += code_point < 0x100     ? fmt::format("x{:02x}", code_point)
                    : code_point < 0x10000 ? fmt::format("u{:04x}", code_point)
                                           : fmt::format("U{:08x}", code_point);
            at += length - 1;
          } else {
            text += '\\';  // Python keeps an unknown escape as it is written
            text += next;
          }
      }
    }
    tokens_.push_back(token{token_kind::string, line_, std::move(text), 0, 0});
    line_ += newlines(rest.substr(0, end + 1));
    at_ += end + 1;
    return true;
  }

  void lex_operator(std::string_view rest, std::vector<char>& closers) {
    static constexpr std::string_view two[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const std::string_view op : two) {
      if (rest.starts_with(op)) {
        tokens_.push_back(token{token_kind::op, line_, std::string(op), 0, 0});
        at_ += 2;
        return;
      }
    }
    const char c = rest[0];
    if (std::string_view("+-/*%~[](){}><=.:|,;").find(c) == std::string_view::npos) {
      if (static_cast<unsigned char>(c) >= 0x80) {
        error("a tag holds a character outside ASCII outside a string (loom reads ASCII names only)");
      }
      error(fmt::format("unexpected character '{}' in a tag", c));
    }
    if (c == '(' || c == '[' || c == '{') closers.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    if (c == ')' || c == ']' || c == '}') {
      if (closers.empty()) error(fmt::format("unexpected '{}'", c));
      if (closers.back() != c) error(fmt::format("unexpected '{}', expected '{}'", c, closers.back()));
      closers.pop_back();
    }
    tokens_.push_back(token{token_kind::op, line_, std::string(1, c), 0, 0});
    ++at_;
  }

  const std::string& name_;
  std::string source_;
  std::size_t at_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<token> tokens_;
};

constexpr std::string_view supported_tags = "for, if, set, macro, break, continue, generation";

// jinja2's parser for the statements and expressions loom implements.
class parser {
 public:
  parser(std::vector<token> tokens, const std::string& name) : tokens_(std::move(tokens)), name_(name) {}

  program parse() {
    program tree;
    tree.name = name_;
    tree.body = parse_body({}, nullptr);
    for (const auto& [function, line] : called_names_) {
      if (!macro_names_.contains(function)) {
        fail(name_, line,
             fmt::format("the function '{}' is not supported (no macro has that name); loom supports: {}", function,
                         supported(supported_functions())));
      }
    }
    tree.has_generation = has_generation_;
    return tree;
  }

 private:
  [[noreturn]] void error(std::string_view what) const { fail(name_, current().line, what); }

  const token& current() const { return tokens_[at_]; }
  const token& peek(std::size_t ahead = 1) const { return tokens_[std::min(at_ + ahead, tokens_.size() - 1)]; }
  token take() {
    token t = tokens_[at_];
    if (at_ + 1 < tokens_.size()) ++at_;
    return t;
  }
  bool is_op(std::string_view op) const { return current().kind == token_kind::op && current().text == op; }
  bool is_name(std::string_view name) const { return current().kind == token_kind::name && current().text == name; }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    take();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    take();
    return true;
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) error(fmt::format("expected '{}', found {}", op, describe(current())));
  }
  void expect_name(std::string_view name) {
    if (!skip_name(name)) error(fmt::format("expected '{}', found {}", name, describe(current())));
  }
  std::string expect_identifier(std::string_view what) {
    if (current().kind != token_kind::name) error(fmt::format("expected {}, found {}", what, describe(current())));
    return take().text;
  }
  void expect_block_end() {
    if (current().kind != token_kind::block_end) error(fmt::format("expected '%}}', found {}", describe(current())));
    take();
  }

  // Deeply nested input would exhaust the stack of this recursive descent (and of the renderer's):
  // jinja2 stops at Python's recursion limit, loom at a depth of its own.
  class nesting {
   public:
    explicit nesting(parser& owner) : owner_(owner) {
      if (++owner_.depth_ > max_depth) owner_.error(fmt::format("the template nests deeper than {} levels", max_depth));
    }
    ~nesting() { --owner_.depth_; }
    nesting(const nesting&) = delete;
    nesting& operator=(const nesting&) = delete;

   private:
    parser& owner_;
  };
  static constexpr int max_depth = 600;

  static expression_ptr node(expression_kind kind, int line) {
    auto made = std::make_unique<expression>();
    made->kind = kind;
    made->line = line;
    return made;
  }

  // ---- statements ----

  // Statements until `{% <one of ends> ...`: the end's name is left to the caller (`which_end`).
  statement_list parse_body(std::initializer_list<std::string_view> ends, std::string* which_end) {
    statement_list body;
    while (true) {
      const token& t = current();
      if (t.kind == token_kind::end_of_input) {
        if (ends.size() == 0) return body;
        std::string wanted;
        for (const std::string_view end : ends) wanted.append(wanted.empty() ? "'" : " or '").append(end) += "'";
        error(fmt::format("the template ends where {} was expected", wanted));
      }
      if (t.kind == token_kind::data) {
        auto text = std::make_unique<statement>();
        text->kind = statement_kind::text;
        text->line = t.line;
        text->text = take().text;
        body.push_back(std::move(text));
      } else if (t.kind == token_kind::variable_begin) {
        take();
        auto output = std::make_unique<statement>();
        output->kind = statement_kind::output;
        output->line = t.line;
        output->expression = parse_tuple(true, {}, false);
        if (current().kind != token_kind::variable_end) {
          error(fmt::format("expected '}}}}', found {}", describe(current())));
        }
        take();
        body.push_back(std::move(output));
      } else if (t.kind == token_kind::block_begin) {
        const token& tag = peek();
        if (tag.kind == token_kind::name && std::find(ends.begin(), ends.end(), tag.text) != ends.end()) {
          take();
          *which_end = tag.text;
          take();
          return body;
        }
        take();
        body.push_back(parse_statement());
      } else {
        error(fmt::format("unexpected {}", describe(t)));
      }
    }
  }

  statement_ptr parse_statement() {
    const nesting guard(*this);
    const token tag = current();
    if (tag.kind != token_kind::name) error(fmt::format("expected a tag's name, found {}", describe(tag)));
    if (tag.text == "for") return parse_for();
    if (tag.text == "if") return parse_if();
    if (tag.text == "set") return parse_set();
    if (tag.text == "macro") return parse_macro();
    if (tag.text == "generation") return parse_generation();
    if (tag.text == "break" || tag.text == "continue") {
      take();
      if (loop_depth_ == 0) fail(name_, tag.line, fmt::format("'{{% {} %}}' outside a for loop", tag.text));
      expect_block_end();
      auto control = std::make_unique<statement>();
      control->kind = tag.text == "break" ? statement_kind::loop_break : statement_kind::loop_continue;
      control->line = tag.line;
      return control;
    }
    static const std::set<std::string_view> ends = {"endfor", "else",     "elif",         "endif",
                                                    "endset", "endmacro", "endgeneration"};
    if (ends.contains(tag.text)) error(fmt::format("'{{% {} %}}' has no block to end", tag.text));
    error(fmt::format("the tag '{}' is not supported; loom supports: {}", tag.text, supported_tags));
  }

  // A name, or names separated by commas (for's and set's targets).
  std::vector<std::string> parse_targets() {
    std::vector<std::string> targets;
    const bool parenthesized = skip_op("(");
    do {
      if (parenthesized && is_op(")")) break;
      targets.push_back(expect_identifier("a name to assign"));
    } while (skip_op(","));
    if (parenthesized) expect_op(")");
    return targets;
  }

  statement_ptr parse_for() {
    auto loop = std::make_unique<statement>();
    loop->kind = statement_kind::for_loop;
    loop->line = take().line;
    loop->targets = parse_targets();
    expect_name("in");
    loop->expression = parse_tuple(false, {"recursive"}, false);
    if (skip_name("if")) loop->loop_filter = parse_expression(true);
    if (is_name("recursive")) error("recursive for loops are not supported");
    expect_block_end();
    ++loop_depth_;
    std::string end;
    loop->body = parse_body({"endfor", "else"}, &end);
    if (end == "else") {
      expect_block_end();
      loop->else_body = parse_body({"endfor"}, &end);
    }
    --loop_depth_;
    expect_block_end();
    return loop;
  }

  statement_ptr parse_if() {
    auto block = std::make_unique<statement>();
    block->kind = statement_kind::if_block;
    block->line = take().line;
    std::string end = "elif";
    while (end == "elif") {
      conditional_branch branch;
      branch.condition = parse_tuple(false, {}, false);
      expect_block_end();
      branch.body = parse_body({"elif", "else", "endif"}, &end);
      block->branches.push_back(std::move(branch));
    }
    if (end == "else") {
      expect_block_end();
      conditional_branch otherwise;
      otherwise.body = parse_body({"endif"}, &end);
      block->branches.push_back(std::move(otherwise));
    }
    expect_block_end();
    return block;
  }

  statement_ptr parse_set() {
    auto assignment = std::make_unique<statement>();
    assignment->line = take().line;
    if (current().kind == token_kind::name && peek().kind == token_kind::op && peek().text == ".") {
      assignment->targets.push_back(take().text);
      take();
      assignment->attribute = expect_identifier("an attribute's name");
    } else {
      assignment->targets = parse_targets();
    }
    if (skip_op("=")) {
      assignment->kind = statement_kind::set;
      assignment->expression = parse_tuple(true, {}, false);
      expect_block_end();
      return assignment;
    }
    if (!assignment->attribute.empty() || assignment->targets.size() != 1) {
      error("a block set ({% set x %}...{% endset %}) assigns one name");
    }
    if (is_op("|")) error("a filter on a block set ({% set x | filter %}) is not supported");
    assignment->kind = statement_kind::set_block;
    expect_block_end();
    ++buffered_depth_;
    std::string end;
    assignment->body = parse_body({"endset"}, &end);
    --buffered_depth_;
    expect_block_end();
    return assignment;
  }

  statement_ptr parse_macro() {
    auto macro = std::make_unique<statement>();
    macro->kind = statement_kind::macro;
    macro->line = take().line;
    macro->text = expect_identifier("the macro's name");
    macro_names_.insert(macro->text);
    expect_op("(");
    while (!is_op(")")) {
      if (!macro->parameters.empty()) expect_op(",");
      if (is_op(")")) break;
      macro_parameter parameter;
      parameter.name = expect_identifier("a parameter's name");
      if (skip_op("=")) {
        parameter.default_value = parse_expression(true);
      } else if (!macro->parameters.empty() && macro->parameters.back().default_value != nullptr) {
        error("a macro's parameter without a default follows one with a default");
      }
      macro->parameters.push_back(std::move(parameter));
    }
    expect_op(")");
    expect_block_end();
    const int loops_outside = loop_depth_;
    loop_depth_ = 0;
    ++buffered_depth_;
    std::string end;
    macro->body = parse_body({"endmacro"}, &end);
    --buffered_depth_;
    loop_depth_ = loops_outside;
    expect_block_end();
    return macro;
  }

  statement_ptr parse_generation() {
    auto generation = std::make_unique<statement>();
    generation->kind = statement_kind::generation;
    generation->line = take().line;
    // transformers measures a block's place in the text rendered so far: inside a macro, a block set
    // or another generation block that place is not where the text lands.
    if (buffered_depth_ > 0) error("a {% generation %} block inside a macro, a block set or a generation block");
    expect_block_end();
    has_generation_ = true;
    ++buffered_depth_;
    std::string end;
    generation->body = parse_body({"endgeneration"}, &end);
    --buffered_depth_;
    expect_block_end();
    return generation;
  }

  // ---- expressions (jinja2's precedence, loosest first) ----

  bool at_tuple_end(std::initializer_list<std::string_view> extra_ends) const {
    const token& t = current();
    if (t.kind == token_kind::variable_end || t.kind == token_kind::block_end ||
        (t.kind == token_kind::op && t.text == ")")) {
      return true;
    }
    return t.kind == token_kind::name && std::find(extra_ends.begin(), extra_ends.end(), t.text) != extra_ends.end();
  }

  expression_ptr parse_tuple(bool with_conditional, std::initializer_list<std::string_view> extra_ends,
                             bool parenthesized) {
    const int line = current().line;
    std::vector<expression_ptr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (at_tuple_end(extra_ends)) break;
      items.push_back(parse_expression(with_conditional));
      if (!is_op(",")) break;
      is_tuple = true;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items.front());
      if (!parenthesized) error(fmt::format("expected an expression, found {}", describe(current())));
    }
    auto made = node(expression_kind::tuple, line);
    made->operands = std::move(items);
    return made;
  }

  expression_ptr parse_expression(bool with_conditional) {
    const nesting guard(*this);
    return with_conditional ? parse_conditional() : parse_or();
  }

  expression_ptr parse_conditional() {
    expression_ptr result = parse_or();
    while (is_name("if")) {
      auto made = node(expression_kind::conditional, take().line);
      expression_ptr condition = parse_or();
      expression_ptr otherwise = skip_name("else") ? parse_conditional() : nullptr;
      made->operands.push_back(std::move(result));
      made->operands.push_back(std::move(condition));
      made->operands.push_back(std::move(otherwise));
      result = std::move(made);
    }
    return result;
  }

  expression_ptr parse_or() {
    expression_ptr left = parse_and();
    while (is_name("or")) {
      auto made = node(expression_kind::logical_or, take().line);
      made->operands.push_back(std::move(left));
      made->operands.push_back(parse_and());
      left = std::move(made);
    }
    return left;
  }

  expression_ptr parse_and() {
    expression_ptr left = parse_not();
    while (is_name("and")) {
      auto made = node(expression_kind::logical_and, take().line);
      made->operands.push_back(std::move(left));
      made->operands.push_back(parse_not());
      left = std::move(made);
    }
    return left;
  }

  expression_ptr parse_not() {
    const nesting guard(*this);
    if (is_name("not")) {
      auto made = node(expression_kind::logical_not, take().line);
      made->operands.push_back(parse_not());
      return made;
    }
    return parse_compare();
  }

  expression_ptr parse_compare() {
    const int line = current().line;
    expression_ptr first = parse_math1();
    auto made = node(expression_kind::compare, line);
    made->operands.push_back(std::move(first));
    while (true) {
      static const std::pair<std::string_view, compare_operator> symbols[] = {
          {"==", compare_operator::equal},  {"!=", compare_operator::not_equal},
          {"<", compare_operator::less},    {"<=", compare_operator::less_equal},
          {">", compare_operator::greater}, {">=", compare_operator::greater_equal}};
      bool found = false;
      for (const auto& [symbol, op] : symbols) {
        if (is_op(symbol)) {
          take();
          made->comparisons.push_back(op);
          found = true;
          break;
        }
      }
      if (!found && is_name("in")) {
        take();
        made->comparisons.push_back(compare_operator::in);
        found = true;
      } else if (!found && is_name("not") && peek().kind == token_kind::name && peek().text == "in") {
        take();
        take();
        made->comparisons.push_back(compare_operator::not_in);
        found = true;
      }
      if (!found) break;
      made->operands.push_back(parse_math1());
    }
    if (made->comparisons.empty()) return std::move(made->operands.front());
    return made;
  }

  expression_ptr arithmetic(expression_ptr left, arithmetic_operator op, expression_ptr right, int line) {
    auto made = node(expression_kind::arithmetic, line);
    made->arithmetic = op;
    made->operands.push_back(std::move(left));
    made->operands.push_back(std::move(right));
    return made;
  }

  expression_ptr parse_math1() {
    expression_ptr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const token op = take();
      left = arithmetic(std::move(left), op.text == "+" ? arithmetic_operator::add : arithmetic_operator::subtract,
                        parse_concat(), op.line);
    }
    return left;
  }

  expression_ptr parse_concat() {
    const int line = current().line;
    expression_ptr first = parse_math2();
    if (!is_op("~")) return first;
    auto made = node(expression_kind::concat, line);
    made->operands.push_back(std::move(first));
    while (skip_op("~")) made->operands.push_back(parse_math2());
    return made;
  }

  expression_ptr parse_math2() {
    expression_ptr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const token op = take();
      const arithmetic_operator which = op.text == "*"    ? arithmetic_operator::multiply
                                        : op.text == "/"  ? arithmetic_operator::divide
                                        : op.text == "//" ? arithmetic_operator::floor_divide
                                                          : arithmetic_operator::modulo;
      left = arithmetic(std::move(left), which, parse_pow(), op.line);
    }
    return left;
  }

  expression_ptr parse_pow() {
    expression_ptr left = parse_unary(true);
    while (is_op("**")) {
      const int line = take().line;
      left = arithmetic(std::move(left), arithmetic_operator::power, parse_unary(true), line);
    }
    return left;
  }

  expression_ptr parse_unary(bool with_filter) {
    const nesting guard(*this);
    expression_ptr result;
    if (is_op("-") || is_op("+")) {
      const token sign = take();
      result = node(sign.text == "-" ? expression_kind::negative : expression_kind::positive, sign.line);
      result->operands.push_back(parse_unary(false));
    } else {
      result = parse_primary();
    }
    result = parse_postfix(std::move(result));
    if (with_filter) result = parse_filter_expression(std::move(result));
    return result;
  }

  expression_ptr parse_primary() {
    const token t = current();
    switch (t.kind) {
      case token_kind::name: {
        take();
        auto made = node(expression_kind::literal, t.line);
        if (t.text == "true" || t.text == "True") {
          made->constant = true;
        } else if (t.text == "false" || t.text == "False") {
          made->constant = false;
        } else if (t.text == "none" || t.text == "None") {
          made->constant = none_value{};
        } else {
          made->kind = expression_kind::name;
          made->name = t.text;
        }
        return made;
      }
      case token_kind::string: {
        std::string text;
        while (current().kind == token_kind::string) text += take().text;  // 'a' 'b' is 'ab'
        auto made = node(expression_kind::literal, t.line);
        made->constant = std::move(text);
        return made;
      }
      case token_kind::integer:
      case token_kind::floating: {
        take();
        auto made = node(expression_kind::literal, t.line);
        if (t.kind == token_kind::integer) {
          made->constant = t.integer;
        } else {
          made->constant = t.floating;
        }
        return made;
      }
      case token_kind::op:
        if (t.text == "(") {
          take();
          expression_ptr inner = parse_tuple(true, {}, true);
          expect_op(")");
          return inner;
        }
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        break;
      default: break;
    }
    error(fmt::format("unexpected {}", describe(t)));
  }

  expression_ptr parse_list() {
    auto made = node(expression_kind::list, take().line);
    while (!is_op("]")) {
      if (!made->operands.empty()) expect_op(",");
      if (is_op("]")) break;
      made->operands.push_back(parse_expression(true));
    }
    expect_op("]");
    return made;
  }

  expression_ptr parse_dict() {
    auto made = node(expression_kind::dict, take().line);
    while (!is_op("}")) {
      if (!made->operands.empty()) expect_op(",");
      if (is_op("}")) break;
      made->operands.push_back(parse_expression(true));
      expect_op(":");
      made->operands.push_back(parse_expression(true));
    }
    expect_op("}");
    return made;
  }

  expression_ptr parse_postfix(expression_ptr subject) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        subject = parse_subscript(std::move(subject));
      } else if (is_op("(")) {
        subject = parse_call(std::move(subject));
      } else {
        return subject;
      }
    }
  }

  expression_ptr parse_filter_expression(expression_ptr subject) {
    while (true) {
      if (is_op("|")) {
        subject = parse_filter(std::move(subject));
      } else if (is_name("is")) {
        subject = parse_test(std::move(subject));
      } else if (is_op("(")) {
        subject = parse_call(std::move(subject));
      } else {
        return subject;
      }
    }
  }

  expression_ptr parse_subscript(expression_ptr subject) {
    const token t = take();
    if (t.text == ".") {
      const token attribute = take();
      if (attribute.kind == token_kind::name) {
        auto made = node(expression_kind::attribute, attribute.line);
        made->name = attribute.text;
        made->operands.push_back(std::move(subject));
        return made;
      }
      if (attribute.kind == token_kind::integer) {
        auto made = node(expression_kind::item, attribute.line);
        made->operands.push_back(std::move(subject));
        auto index = node(expression_kind::literal, attribute.line);
        index->constant = attribute.integer;
        made->operands.push_back(std::move(index));
        return made;
      }
      fail(name_, attribute.line, fmt::format("expected an attribute's name after '.', found {}", describe(attribute)));
    }
    std::vector<expression_ptr> keys;
    while (!is_op("]")) {
      if (!keys.empty()) expect_op(",");
      keys.push_back(parse_subscribed());
    }
    expect_op("]");
    if (keys.empty()) fail(name_, t.line, "an empty subscript '[]'");
    if (keys.size() == 1 && keys.front() != nullptr && keys.front()->kind == expression_kind::slice) {
      keys.front()->operands.front() = std::move(subject);
      return std::move(keys.front());
    }
    auto made = node(expression_kind::item, t.line);
    made->operands.push_back(std::move(subject));
    if (keys.size() == 1) {
      made->operands.push_back(std::move(keys.front()));
    } else {
      auto key = node(expression_kind::tuple, t.line);
      key->operands = std::move(keys);
      made->operands.push_back(std::move(key));
    }
    return made;
  }

  // `[a]`, or a slice `[a:b:c]` with any bound left out (its first operand is left for the subject).
  expression_ptr parse_subscribed() {
    const int line = current().line;
    auto slice = node(expression_kind::slice, line);
    slice->operands.push_back(nullptr);
    if (skip_op(":")) {
      slice->operands.push_back(nullptr);
    } else {
      expression_ptr start = parse_expression(true);
      if (!skip_op(":")) return start;
      slice->operands.push_back(std::move(start));
    }
    const auto bound_ends = [this] { return is_op("]") || is_op(","); };
    if (is_op(":") || bound_ends()) {
      slice->operands.push_back(nullptr);
    } else {
      slice->operands.push_back(parse_expression(true));
    }
    if (skip_op(":") && !bound_ends()) {
      slice->operands.push_back(parse_expression(true));
    } else {
      slice->operands.push_back(nullptr);
    }
    return slice;
  }

  void parse_arguments(expression& call) {
    expect_op("(");
    bool need_comma = false;
    while (!is_op(")")) {
      if (need_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**")) error("*args and **kwargs in a call are not supported");
      if (current().kind == token_kind::name && peek().kind == token_kind::op && peek().text == "=") {
        std::string keyword = take().text;
        take();
        call.keywords.push_back(keyword_argument{std::move(keyword), parse_expression(true)});
      } else {
        if (!call.keywords.empty()) error("a positional argument follows a keyword argument");
        call.operands.push_back(parse_expression(true));
      }
      need_comma = true;
    }
    expect_op(")");
  }

  expression_ptr parse_call(expression_ptr callee) {
    const int line = current().line;
    if (callee->kind == expression_kind::attribute) {
      const auto& methods = supported_methods();
      if (std::find(methods.begin(), methods.end(), callee->name) == methods.end()) {
        fail(name_, callee->line,
             fmt::format("the method '{}' is not supported; loom supports: {}", callee->name, supported(methods)));
      }
    } else if (callee->kind == expression_kind::name) {
      const auto& functions = supported_functions();
      if (std::find(functions.begin(), functions.end(), callee->name) == functions.end()) {
        called_names_.emplace_back(callee->name, callee->line);
      }
    }
    auto made = node(expression_kind::call, line);
    made->operands.push_back(std::move(callee));
    parse_arguments(*made);
    return made;
  }

  std::string parse_dotted_name(std::string_view what) {
    std::string name = expect_identifier(what);
    while (is_op(".")) {
      take();
      name += '.' + expect_identifier(what);
    }
    return name;
  }

  expression_ptr parse_filter(expression_ptr subject) {
    take();
    const int line = current().line;
    auto made = node(expression_kind::filter, line);
    made->name = parse_dotted_name("a filter's name");
    const auto& filters = supported_filters();
    if (std::find(filters.begin(), filters.end(), made->name) == filters.end()) {
      fail(name_, line,
           fmt::format("the filter '{}' is not supported; loom supports: {}", made->name, supported(filters)));
    }
    made->operands.push_back(std::move(subject));
    if (is_op("(")) parse_arguments(*made);
    return made;
  }

  expression_ptr parse_test(expression_ptr subject) {
    take();
    auto made = node(expression_kind::test, current().line);
    made->negated = skip_name("not");
    const int line = current().line;
    made->name = parse_dotted_name("a test's name");
    const auto& tests = supported_tests();
    if (std::find(tests.begin(), tests.end(), made->name) == tests.end()) {
      fail(name_, line, fmt::format("the test '{}' is not supported; loom supports: {}", made->name, supported(tests)));
    }
    made->operands.push_back(std::move(subject));
    const token& t = current();
    if (is_op("(")) {
      parse_arguments(*made);
    } else if ((t.kind == token_kind::name || t.kind == token_kind::string || t.kind == token_kind::integer ||
                t.kind == token_kind::floating || is_op("(") || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      // jinja2 takes one argument without parentheses: `x is divisibleby 3`
      if (is_name("is")) error("tests cannot be chained ('is' after a test)");
      made->operands.push_back(parse_postfix(parse_primary()));
    }
    return made;
  }

  std::vector<token> tokens_;
  std::size_t at_ = 0;
  const std::string& name_;
  int depth_ = 0;
  int loop_depth_ = 0;
  int buffered_depth_ = 0;
  bool has_generation_ = false;
  std::set<std::string, std::less<>> macro_names_;
  std::vector<std::pair<std::string, int>> called_names_;
};

}  // namespace

program parse(std::string_view source, std::string name) {
  std::vector<token> tokens = lexer(source, name).tokens();
  return parser(std::move(tokens), name).parse();
}

}  // namespace loom::data::jinja
