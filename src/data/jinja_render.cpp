// loom::data::jinja's tree rendered as Python's jinja2 renders the template under transformers'
// settings: jinja2's scoping (a frame per loop iteration, macro and block), its Undefined, its filters
// and tests, and Python's own rules for the values (str() and repr(), json.dumps, arithmetic,
// comparison, slicing, the str and dict methods).
#include <loom/base/text.hpp>
#include <loom/data/chat_template.hpp>

#include "jinja.hpp"
#include "utf8.hpp"

#include <fmt/format.h>
#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::data::jinja {

void fail(std::string_view template_name, int line, std::string_view what) {
  if (line > 0) throw_error<chat_template_error>("{} line {}: {}", template_name, line, what);
  throw_error<chat_template_error>("{}: {}", template_name, what);
}

bool python_space(std::uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

namespace {

// ---- UTF-8 ---------------------------------------------------------------------------------------

bool is_ascii(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

std::vector<std::uint32_t> code_points(std::string_view text) {
  std::vector<std::uint32_t> points;
  points.reserve(text.size());
  for (std::size_t at = 0; at < text.size();) {
    const auto [code_point, length] = detail::code_point_at(text, at);
    points.push_back(code_point);
    at += length;
  }
  return points;
}

std::string from_code_points(const std::vector<std::uint32_t>& points, std::size_t begin, std::size_t end) {
  std::string text;
  for (std::size_t k = begin; k < end; ++k) detail::append_utf8(text, points[k]);
  return text;
}
std::string from_code_points(const std::vector<std::uint32_t>& points) {
  return from_code_points(points, 0, points.size());
}

std::size_t code_point_count(std::string_view text) {
  return static_cast<std::size_t>(
      std::count_if(text.begin(), text.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

// The code point's index of a byte offset.
std::int64_t code_point_index(std::string_view text, std::size_t byte_offset) {
  return static_cast<std::int64_t>(code_point_count(text.substr(0, byte_offset)));
}

// Python's str.upper() / lower() / title() of one code point, by Unicode's one-to-one mappings
// (Python's few one-to-many mappings, ß to SS among them, are not made).
std::uint32_t to_upper(std::uint32_t c) {
  return static_cast<std::uint32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}
std::uint32_t to_lower(std::uint32_t c) {
  return static_cast<std::uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}
std::uint32_t to_title(std::uint32_t c) {
  return static_cast<std::uint32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c)));
}
bool is_cased(std::uint32_t c) {
  const auto category = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return category == UTF8PROC_CATEGORY_LU || category == UTF8PROC_CATEGORY_LL || category == UTF8PROC_CATEGORY_LT;
}

std::string map_case(std::string_view text, std::uint32_t (*mapping)(std::uint32_t)) {
  if (is_ascii(text)) {
    std::string mapped(text);
    for (char& c : mapped) c = static_cast<char>(mapping(static_cast<unsigned char>(c)));
    return mapped;
  }
  std::string mapped;
  for (const std::uint32_t c : code_points(text)) detail::append_utf8(mapped, mapping(c));
  return mapped;
}
std::string upper(std::string_view text) { return map_case(text, to_upper); }
std::string lower(std::string_view text) { return map_case(text, to_lower); }

// Python's str.title(): a cased letter after a cased letter lower case, any other title case.
std::string python_title(std::string_view text) {
  std::string out;
  bool previous_cased = false;
  for (const std::uint32_t c : code_points(text)) {
    detail::append_utf8(out, previous_cased ? to_lower(c) : to_title(c));
    previous_cased = is_cased(c);
  }
  return out;
}

// Python's str.capitalize(): the first code point title case, the rest lower case.
std::string python_capitalize(std::string_view text) {
  const std::vector<std::uint32_t> points = code_points(text);
  std::string out;
  for (std::size_t k = 0; k < points.size(); ++k)
    detail::append_utf8(out, k == 0 ? to_title(points[k]) : to_lower(points[k]));
  return out;
}

// jinja2's title filter: each run between [-\s({[<] runs upper-cased first, lower-cased after.
std::string jinja_title(std::string_view text) {
  const auto separator = [](std::uint32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || python_space(c);
  };
  std::string out;
  bool run_start = true;
  bool in_separators = false;
  for (const std::uint32_t c : code_points(text)) {
    const bool is_separator = separator(c);
    if (is_separator != in_separators) run_start = true;
    in_separators = is_separator;
    detail::append_utf8(out, run_start ? to_upper(c) : to_lower(c));
    run_start = false;
  }
  return out;
}

bool printable(std::uint32_t c) {
  if (c < 0x80) return c >= 0x20 && c < 0x7F;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return false;
    default: return true;
  }
}

// Python's repr() of a str.
std::string python_repr(std::string_view text) {
  const bool has_single = text.find('\'') != std::string_view::npos;
  const bool has_double = text.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (const std::uint32_t c : code_points(text)) {
    if (c == static_cast<std::uint32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (printable(c)) {
      detail::append_utf8(out, c);
    } else if (c < 0x100) {
      out += fmt::format("\\x{:02x}", c);
    } else if (c < 0x10000) {
      out += fmt::format("\\u{:04x}", c);
    } else {
      out += fmt::format("\\U{:08x}", c);
    }
  }
  out += quote;
  return out;
}

// Python's repr() of a float (the shortest text that reads back, positional from 1e-4 to 1e16).
std::string python_float(double number) {
  if (std::isnan(number)) return "nan";
  if (std::isinf(number)) return number > 0 ? "inf" : "-inf";
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, number, std::chars_format::scientific);
  std::string_view text(buffer, static_cast<std::size_t>(result.ptr - buffer));
  std::string out;
  if (text.front() == '-') {
    out += '-';
    text.remove_prefix(1);
  }
  const std::size_t e = text.find('e');
  std::string digits;
  for (const char c : text.substr(0, e)) {
    if (c != '.') digits += c;
  }
  int exponent = 0;
  std::from_chars(text.data() + e + (text[e + 1] == '+' ? 2 : 1), text.data() + text.size(), exponent);
  if (exponent >= -4 && exponent < 16) {
    if (exponent >= 0) {
      const auto whole = static_cast<std::size_t>(exponent) + 1;
      if (digits.size() <= whole) {
        out += digits + std::string(whole - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, whole) + "." + digits.substr(whole);
      }
    } else {
      out += "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out;
}

// ---- values --------------------------------------------------------------------------------------

// Where an error is raised: the template and the line.
struct site {
  std::string_view name;
  int line;
  [[noreturn]] void error(std::string_view what) const { fail(name, line, what); }
};

bool is_number(const value& v) { return v.is<bool>() || v.is<std::int64_t>() || v.is<double>(); }
bool is_integer(const value& v) { return v.is<bool>() || v.is<std::int64_t>(); }
std::int64_t integer_of(const value& v) { return v.is<bool>() ? (v.as<bool>() ? 1 : 0) : v.as<std::int64_t>(); }
double float_of(const value& v) { return v.is<double>() ? v.as<double>() : static_cast<double>(integer_of(v)); }
// Python compares an int with a float exactly; a long double holds both exactly (64-bit mantissa or more).
long double exact_of(const value& v) {
  return v.is<double>() ? static_cast<long double>(v.as<double>()) : static_cast<long double>(integer_of(v));
}

const value_list& items_of(const value& v) { return *v.as<sequence_value>().items; }
bool is_kind(const value& v, sequence_kind kind) {
  return v.is<sequence_value>() && v.as<sequence_value>().kind == kind;
}
// A list or a tuple: what can be indexed, measured and reversed.
bool is_indexable(const value& v) {
  return v.is<sequence_value>() && (is_kind(v, sequence_kind::list) || is_kind(v, sequence_kind::tuple));
}

std::string type_name(const value& v) {
  if (v.is<undefined_value>()) return "Undefined";
  if (v.is<none_value>()) return "NoneType";
  if (v.is<bool>()) return "bool";
  if (v.is<std::int64_t>()) return "int";
  if (v.is<double>()) return "float";
  if (v.is<std::string>()) return "str";
  if (v.is<sequence_value>()) {
    switch (v.as<sequence_value>().kind) {
      case sequence_kind::list: return "list";
      case sequence_kind::tuple: return "tuple";
      case sequence_kind::generator: return "generator";
      case sequence_kind::dict_items: return "dict_items";
      case sequence_kind::dict_keys: return "dict_keys";
      case sequence_kind::dict_values: return "dict_values";
    }
  }
  if (v.is<dict_value>()) return "dict";
  if (v.is<namespace_value>()) return "Namespace";
  if (v.is<macro_value>()) return "Macro";
  if (v.is<method_value>()) return "builtin_function_or_method";
  if (v.is<loop_value>()) return "LoopContext";
  return "builtin_function";
}

bool truthy(const value& v) {
  if (v.is<undefined_value>() || v.is<none_value>()) return false;
  if (v.is<bool>()) return v.as<bool>();
  if (v.is<std::int64_t>()) return v.as<std::int64_t>() != 0;
  if (v.is<double>()) return v.as<double>() != 0;
  if (v.is<std::string>()) return !v.as<std::string>().empty();
  if (v.is<sequence_value>()) return is_kind(v, sequence_kind::generator) || !items_of(v).empty();
  if (v.is<dict_value>()) return !v.as<dict_value>().entries->items.empty();
  return true;
}

std::string python_str(const value& v, const site& where);

std::string python_repr(const value& v, const site& where) {
  if (v.is<undefined_value>()) return "Undefined";
  if (v.is<std::string>()) return python_repr(std::string_view(v.as<std::string>()));
  return python_str(v, where);
}

std::string joined_reprs(const value_list& items, const site& where) {
  std::string out;
  for (std::size_t k = 0; k < items.size(); ++k) out.append(k == 0 ? "" : ", ").append(python_repr(items[k], where));
  return out;
}

std::string dict_repr(const dict_entries& entries, const site& where) {
  std::string out = "{";
  for (std::size_t k = 0; k < entries.items.size(); ++k) {
    out.append(k == 0 ? "" : ", ")
        .append(python_repr(std::string_view(entries.items[k].first)))
        .append(": ")
        .append(python_repr(entries.items[k].second, where));
  }
  return out + "}";
}

// Python's str() of a value, as jinja2 prints it.
std::string python_str(const value& v, const site& where) {
  if (v.is<undefined_value>()) return "";
  if (v.is<none_value>()) return "None";
  if (v.is<bool>()) return v.as<bool>() ? "True" : "False";
  if (v.is<std::int64_t>()) return std::to_string(v.as<std::int64_t>());
  if (v.is<double>()) return python_float(v.as<double>());
  if (v.is<std::string>()) return v.as<std::string>();
  if (v.is<sequence_value>()) {
    const value_list& items = items_of(v);
    switch (v.as<sequence_value>().kind) {
      case sequence_kind::list: return "[" + joined_reprs(items, where) + "]";
      case sequence_kind::tuple: return "(" + joined_reprs(items, where) + (items.size() == 1 ? ",)" : ")");
      case sequence_kind::dict_items: return "dict_items([" + joined_reprs(items, where) + "])";
      case sequence_kind::dict_keys: return "dict_keys([" + joined_reprs(items, where) + "])";
      case sequence_kind::dict_values: return "dict_values([" + joined_reprs(items, where) + "])";
      case sequence_kind::generator:
        where.error(
            "a generator (what select, map, reverse and the like give) is printed; loom prints none: add |list");
    }
  }
  if (v.is<dict_value>()) return dict_repr(*v.as<dict_value>().entries, where);
  if (v.is<namespace_value>()) return "<Namespace " + dict_repr(*v.as<namespace_value>().attributes, where) + ">";
  if (v.is<macro_value>()) return "<Macro '" + v.as<macro_value>().definition->text + "'>";
  if (v.is<loop_value>()) {
    const loop_state& state = *v.as<loop_value>().state;
    return fmt::format("<LoopContext {}/{}>", state.index0 + 1, state.items->size());
  }
  if (v.is<method_value>())
    where.error(fmt::format("the method '{}' is printed, not called", v.as<method_value>().name));
  where.error("a builtin function is printed, not called");
}

// Python's ==.
bool equal(const value& a, const value& b) {
  if (is_number(a) && is_number(b)) {
    if (is_integer(a) && is_integer(b)) return integer_of(a) == integer_of(b);
    return exact_of(a) == exact_of(b);
  }
  if (a.data.index() != b.data.index()) return false;
  if (a.is<undefined_value>() || a.is<none_value>()) return true;
  if (a.is<std::string>()) return a.as<std::string>() == b.as<std::string>();
  if (a.is<sequence_value>()) {
    const auto& x = a.as<sequence_value>();
    const auto& y = b.as<sequence_value>();
    if (x.kind != y.kind) return false;
    if (x.kind == sequence_kind::generator) return x.items == y.items;
    return std::equal(x.items->begin(), x.items->end(), y.items->begin(), y.items->end(), equal);
  }
  if (a.is<dict_value>()) {
    const dict_entries& x = *a.as<dict_value>().entries;
    const dict_entries& y = *b.as<dict_value>().entries;
    if (x.items.size() != y.items.size()) return false;
    return std::all_of(x.items.begin(), x.items.end(), [&](const auto& entry) {
      const value* other = y.find(entry.first);
      return other != nullptr && equal(entry.second, *other);
    });
  }
  if (a.is<namespace_value>()) return a.as<namespace_value>().attributes == b.as<namespace_value>().attributes;
  if (a.is<macro_value>()) return a.as<macro_value>().definition == b.as<macro_value>().definition;
  if (a.is<loop_value>()) return a.as<loop_value>().state == b.as<loop_value>().state;
  return false;
}

// Python's <, for the types that order.
bool less(const value& a, const value& b, const site& where) {
  if (is_number(a) && is_number(b)) {
    if (is_integer(a) && is_integer(b)) return integer_of(a) < integer_of(b);
    return exact_of(a) < exact_of(b);
  }
  if (a.is<std::string>() && b.is<std::string>()) return a.as<std::string>() < b.as<std::string>();
  if (is_indexable(a) && is_indexable(b) && a.as<sequence_value>().kind == b.as<sequence_value>().kind) {
    const value_list& x = items_of(a);
    const value_list& y = items_of(b);
    for (std::size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (!equal(x[k], y[k])) return less(x[k], y[k], where);
    }
    return x.size() < y.size();
  }
  if (a.is<undefined_value>()) where.error(a.as<undefined_value>().why);
  if (b.is<undefined_value>()) where.error(b.as<undefined_value>().why);
  where.error(fmt::format("'<' is not supported between instances of '{}' and '{}'", type_name(a), type_name(b)));
}

// Python's iter(): what a for loop, list, join and the like go through.
value_list iterate(const value& v, const site& where) {
  if (v.is<undefined_value>()) return {};
  if (v.is<sequence_value>()) return items_of(v);
  if (v.is<dict_value>()) {
    value_list keys;
    for (const auto& entry : v.as<dict_value>().entries->items) keys.emplace_back(entry.first);
    return keys;
  }
  if (v.is<std::string>()) {
    const std::string& text = v.as<std::string>();
    value_list characters;
    for (std::size_t at = 0; at < text.size();) {
      const std::size_t length = detail::code_point_at(text, at).second;
      characters.emplace_back(text.substr(at, length));
      at += length;
    }
    return characters;
  }
  where.error(fmt::format("'{}' object is not iterable", type_name(v)));
}

// Python's len().
std::int64_t length_of(const value& v, const site& where) {
  if (v.is<undefined_value>()) return 0;
  if (v.is<std::string>()) return static_cast<std::int64_t>(code_point_count(v.as<std::string>()));
  if (v.is<sequence_value>() && !is_kind(v, sequence_kind::generator))
    return static_cast<std::int64_t>(items_of(v).size());
  if (v.is<dict_value>()) return static_cast<std::int64_t>(v.as<dict_value>().entries->items.size());
  if (v.is<loop_value>()) return static_cast<std::int64_t>(v.as<loop_value>().state->items->size());
  where.error(fmt::format("object of type '{}' has no len()", type_name(v)));
}

// Python's `item in container`.
bool contains(const value& container, const value& item, const site& where) {
  if (container.is<undefined_value>()) return false;
  if (container.is<std::string>()) {
    if (!item.is<std::string>()) {
      if (item.is<undefined_value>()) where.error(item.as<undefined_value>().why);
      where.error(fmt::format("'in <string>' requires string as left operand, not {}", type_name(item)));
    }
    return container.as<std::string>().find(item.as<std::string>()) != std::string::npos;
  }
  if (container.is<sequence_value>()) {
    const value_list& items = items_of(container);
    return std::any_of(items.begin(), items.end(), [&](const value& x) { return equal(x, item); });
  }
  if (container.is<dict_value>()) {
    if (item.is<sequence_value>() || item.is<dict_value>()) {
      where.error(fmt::format("unhashable type: '{}'", type_name(item)));
    }
    return item.is<std::string>() && container.as<dict_value>().entries->find(item.as<std::string>()) != nullptr;
  }
  where.error(fmt::format("argument of type '{}' is not iterable", type_name(container)));
}

// ---- JSON as Python's json.dumps writes it (transformers' tojson) --------------------------------

struct json_style {
  bool ensure_ascii = false;
  std::optional<std::string> indent;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};

void json_string(std::string_view text, bool ensure_ascii, std::string& out) {
  out += '"';
  for (std::size_t at = 0; at < text.size();) {
    const auto byte = static_cast<unsigned char>(text[at]);
    if (byte >= 0x80) {
      const auto [code_point, length] = detail::code_point_at(text, at);
      if (!ensure_ascii) {
        out.append(text.substr(at, length));
      } else if (code_point < 0x10000) {
        out += fmt::format("\\u{:04x}", code_point);
      } else {
        const std::uint32_t offset = code_point - 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (offset >> 10), 0xDC00 + (offset & 0x3FF));
      }
      at += length;
      continue;
    }
    switch (byte) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (byte < 0x20) {
          out += fmt::format("\\u{:04x}", byte);
        } else {
          out += static_cast<char>(byte);
        }
    }
    ++at;
  }
  out += '"';
}

void dump_json(const value& v, const json_style& style, int depth, std::string& out, const site& where) {
  if (v.is<none_value>()) {
    out += "null";
  } else if (v.is<bool>()) {
    out += v.as<bool>() ? "true" : "false";
  } else if (v.is<std::int64_t>()) {
    out += std::to_string(v.as<std::int64_t>());
  } else if (v.is<double>()) {
    const double number = v.as<double>();
    out += std::isnan(number)   ? "NaN"
           : std::isinf(number) ? (number > 0 ? "Infinity" : "-Infinity")
                                : python_float(number);
  } else if (v.is<std::string>()) {
    json_string(v.as<std::string>(), style.ensure_ascii, out);
  } else if (is_indexable(v) || v.is<dict_value>()) {
    const bool is_dict = v.is<dict_value>();
    std::vector<const std::pair<std::string, value>*> entries;
    if (is_dict) {
      for (const auto& entry : v.as<dict_value>().entries->items) entries.push_back(&entry);
      if (style.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
    }
    const std::size_t count = is_dict ? entries.size() : items_of(v).size();
    const char open = is_dict ? '{' : '[';
    const char close = is_dict ? '}' : ']';
    if (count == 0) {
      out += open;
      out += close;
      return;
    }
    std::string newline;
    if (style.indent) {
      newline = "\n";
      for (int k = 0; k <= depth; ++k) newline += *style.indent;
    }
    out += open;
    out += newline;
    for (std::size_t k = 0; k < count; ++k) {
      if (k > 0) out += style.item_separator + newline;
      if (is_dict) {
        json_string(entries[k]->first, style.ensure_ascii, out);
        out += style.key_separator;
        dump_json(entries[k]->second, style, depth + 1, out, where);
      } else {
        dump_json(items_of(v)[k], style, depth + 1, out, where);
      }
    }
    if (style.indent) {
      out += '\n';
      for (int k = 0; k < depth; ++k) out += *style.indent;
    }
    out += close;
  } else {
    where.error(fmt::format("Object of type {} is not JSON serializable", type_name(v)));
  }
}

// ---- Python's str methods ------------------------------------------------------------------------

std::vector<std::uint32_t> strip_set(const value& chars, const site& where) {
  if (chars.is<none_value>() || chars.is<undefined_value>()) return {};
  if (!chars.is<std::string>()) where.error("strip's argument must be a string or None");
  return code_points(chars.as<std::string>());
}

// Python's str.strip(chars) / lstrip / rstrip; no chars: whitespace.
std::string python_strip(std::string_view text, const std::vector<std::uint32_t>* chars, bool left, bool right) {
  const auto strips = [&](std::uint32_t c) {
    return chars == nullptr ? python_space(c) : std::find(chars->begin(), chars->end(), c) != chars->end();
  };
  std::size_t begin = 0;
  std::size_t end = text.size();
  if (left) {
    while (begin < end) {
      const auto [c, length] = detail::code_point_at(text, begin);
      if (!strips(c)) break;
      begin += length;
    }
  }
  if (right) {
    while (end > begin) {
      std::size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
      if (!strips(detail::code_point_at(text, start).first)) break;
      end = start;
    }
  }
  return std::string(text.substr(begin, end - begin));
}

value_list python_split(std::string_view text, const value& separator, std::int64_t max_splits, bool from_right,
                        const site& where) {
  std::vector<std::string> parts;
  if (separator.is<none_value>() || separator.is<undefined_value>()) {
    // Runs of whitespace separate; none at either end makes an empty part.
    const std::vector<std::uint32_t> points = code_points(text);
    std::vector<std::pair<std::size_t, std::size_t>> words;
    std::size_t k = 0;
    while (k < points.size()) {
      while (k < points.size() && python_space(points[k])) ++k;
      if (k == points.size()) break;
      const std::size_t start = k;
      while (k < points.size() && !python_space(points[k])) ++k;
      words.emplace_back(start, k);
    }
    if (max_splits >= 0 && static_cast<std::size_t>(max_splits) + 1 < words.size()) {
      const auto kept = static_cast<std::size_t>(max_splits);
      if (from_right) {
        // The rest keeps its leading whitespace: 'a b c'.rsplit(None, 1) is ['a b', 'c'].
        std::size_t first = 0;
        while (first < points.size() && python_space(points[first])) ++first;
        const std::size_t rest_end = words[words.size() - kept - 1].second;
        parts.push_back(from_code_points(points, first, rest_end));
        for (std::size_t w = words.size() - kept; w < words.size(); ++w) {
          parts.push_back(from_code_points(points, words[w].first, words[w].second));
        }
      } else {
        for (std::size_t w = 0; w < kept; ++w)
          parts.push_back(from_code_points(points, words[w].first, words[w].second));
        std::size_t last = points.size();
        while (last > 0 && python_space(points[last - 1])) --last;
        parts.push_back(from_code_points(points, words[kept].first, last));
      }
    } else {
      for (const auto& [start, end] : words) parts.push_back(from_code_points(points, start, end));
    }
  } else {
    if (!separator.is<std::string>()) where.error("split's separator must be a string or None");
    const std::string& sep = separator.as<std::string>();
    if (sep.empty()) where.error("split's separator is empty");
    std::vector<std::size_t> cuts;
    for (std::size_t at = text.find(sep); at != std::string_view::npos; at = text.find(sep, at + sep.size())) {
      cuts.push_back(at);
    }
    if (max_splits >= 0 && static_cast<std::size_t>(max_splits) < cuts.size()) {
      const auto kept = static_cast<std::size_t>(max_splits);
      if (from_right) {
        // From the right, the separators found from the left can differ where they overlap ('aaa'.rsplit('aa')).
        cuts.clear();
        std::size_t end = text.size();
        while (cuts.size() < kept && end >= sep.size()) {
          const std::size_t at = text.rfind(sep, end - sep.size());
          if (at == std::string_view::npos) break;
          cuts.insert(cuts.begin(), at);
          end = at;
        }
      } else {
        cuts.resize(kept);
      }
    } else if (from_right) {
      cuts.clear();
      for (std::size_t end = text.size(); end >= sep.size();) {
        const std::size_t at = text.rfind(sep, end - sep.size());
        if (at == std::string_view::npos) break;
        cuts.insert(cuts.begin(), at);
        end = at;
      }
    }
    std::size_t start = 0;
    for (const std::size_t cut : cuts) {
      parts.emplace_back(text.substr(start, cut - start));
      start = cut + sep.size();
    }
    parts.emplace_back(text.substr(start));
  }
  value_list items;
  for (std::string& part : parts) items.emplace_back(std::move(part));
  return items;
}

// Python's str.replace(old, new, count).
std::string python_replace(std::string_view text, std::string_view old_text, std::string_view new_text,
                           std::int64_t count) {
  std::string out;
  std::int64_t done = 0;
  if (old_text.empty()) {
    // Between every two code points, and at both ends.
    const std::vector<std::uint32_t> points = code_points(text);
    for (std::size_t k = 0; k <= points.size(); ++k) {
      if (count < 0 || done < count) {
        out += new_text;
        ++done;
      }
      if (k < points.size()) detail::append_utf8(out, points[k]);
    }
    return out;
  }
  std::size_t start = 0;
  for (std::size_t at = text.find(old_text); at != std::string_view::npos && (count < 0 || done < count);
       at = text.find(old_text, start)) {
    out.append(text.substr(start, at - start)).append(new_text);
    start = at + old_text.size();
    ++done;
  }
  out.append(text.substr(start));
  return out;
}

// Python's str.splitlines().
std::vector<std::string> python_splitlines(std::string_view text) {
  const std::vector<std::uint32_t> points = code_points(text);
  std::vector<std::string> lines;
  std::size_t start = 0;
  for (std::size_t k = 0; k < points.size(); ++k) {
    const std::uint32_t c = points[k];
    if (c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
        c == 0x2028 || c == 0x2029) {
      lines.push_back(from_code_points(points, start, k));
      if (c == '\r' && k + 1 < points.size() && points[k + 1] == '\n') ++k;
      start = k + 1;
    }
  }
  if (start < points.size()) lines.push_back(from_code_points(points, start, points.size()));
  return lines;
}

std::string html_escape(std::string_view text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// Python's int(str): optional sign and whitespace, digits with single underscores between.
std::optional<std::int64_t> parse_python_int(std::string_view text, int base) {
  text = python_rstrip(text);
  while (!text.empty() && python_space(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  bool negative = false;
  if (!text.empty() && (text.front() == '+' || text.front() == '-')) {
    negative = text.front() == '-';
    text.remove_prefix(1);
  }
  if (base == 0 || base == 16 || base == 8 || base == 2) {
    if (text.size() > 2 && text[0] == '0') {
      const char prefix = static_cast<char>(text[1] | 0x20);
      const int prefix_base = prefix == 'x' ? 16 : prefix == 'o' ? 8 : prefix == 'b' ? 2 : 0;
      if (prefix_base != 0 && (base == 0 || base == prefix_base)) {
        base = prefix_base;
        text.remove_prefix(2);
        if (!text.empty() && text.front() == '_') text.remove_prefix(1);
      }
    }
    if (base == 0) base = 10;
  }
  std::string digits;
  for (std::size_t k = 0; k < text.size(); ++k) {
    if (text[k] == '_' && k > 0 && k + 1 < text.size() && text[k - 1] != '_') continue;
    digits += text[k];
  }
  if (digits.empty()) return std::nullopt;
  std::int64_t number = 0;
  const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), number, base);
  if (ec != std::errc{} || ptr != digits.data() + digits.size()) return std::nullopt;
  return negative ? -number : number;
}

// Python's float(str), which reads inf, nan and exponents too.
std::optional<double> parse_python_float(std::string_view text) {
  text = python_rstrip(text);
  while (!text.empty() && python_space(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  std::string cleaned;
  for (const char c : text) {
    if (c != '_') cleaned += c;
  }
  std::string_view body = cleaned;
  bool negative = false;
  if (!body.empty() && (body.front() == '+' || body.front() == '-')) {
    negative = body.front() == '-';
    body.remove_prefix(1);
  }
  const std::string folded = lower(body);
  if (folded == "inf" || folded == "infinity") return negative ? -HUGE_VAL : HUGE_VAL;
  if (folded == "nan") return std::nan("");
  double number = 0;
  const auto [ptr, ec] = std::from_chars(body.data(), body.data() + body.size(), number);
  if (body.empty() || ptr != body.data() + body.size() || (ec != std::errc{} && ec != std::errc::result_out_of_range)) {
    return std::nullopt;
  }
  return negative ? -number : number;
}

// ---- arguments -----------------------------------------------------------------------------------

struct arguments {
  value_list positional;
  std::vector<std::pair<std::string, value>> keywords;
};

// A call's arguments matched to the parameters' names, as Python matches them.
class bound_arguments {
 public:
  bound_arguments(const arguments& given, std::string_view callee, std::initializer_list<std::string_view> names,
                  const site& where)
      : names_(names), slots_(names.size()) {
    if (given.positional.size() > names_.size()) {
      where.error(
          fmt::format("{} takes at most {}", callee, counted(static_cast<std::int64_t>(names_.size()), "argument")));
    }
    for (std::size_t k = 0; k < given.positional.size(); ++k) slots_[k] = given.positional[k];
    for (const auto& [name, argument] : given.keywords) {
      const auto found = std::find(names_.begin(), names_.end(), name);
      if (found == names_.end()) where.error(fmt::format("{} has no parameter '{}'", callee, name));
      auto& slot = slots_[static_cast<std::size_t>(found - names_.begin())];
      if (slot) where.error(fmt::format("{} got two values for '{}'", callee, name));
      slot = argument;
    }
  }
  [[nodiscard]] bool has(std::size_t k) const { return slots_[k].has_value(); }
  [[nodiscard]] value get(std::size_t k, value fallback) const { return slots_[k] ? *slots_[k] : std::move(fallback); }

 private:
  std::vector<std::string_view> names_;
  std::vector<std::optional<value>> slots_;
};

// ---- rendering -----------------------------------------------------------------------------------

// jinja2's scopes: the template's names, a loop iteration's, a macro call's, a block's.
struct frame {
  std::vector<std::pair<std::string, value>> variables;
  frame* parent = nullptr;

  const value* find(std::string_view name) const {
    for (const frame* f = this; f != nullptr; f = f->parent) {
      for (const auto& [key, v] : f->variables) {
        if (key == name) return &v;
      }
    }
    return nullptr;
  }
  void assign(std::string_view name, value v) {
    for (auto& [key, existing] : variables) {
      if (key == name) {
        existing = std::move(v);
        return;
      }
    }
    variables.emplace_back(std::string(name), std::move(v));
  }
};

enum class flow : std::uint8_t { normal, break_loop, continue_loop };

// transformers' TemplateNamespace keeps names that start with '_' out of a namespace.
void refuse_private_attribute(std::string_view name, const site& where) {
  if (name.starts_with('_')) {
    where.error(
        fmt::format("chat templates cannot store underscore-prefixed attributes on a namespace, but got '{}'", name));
  }
}

constexpr std::int64_t max_range = 100000;  // jinja2's sandbox refuses longer ranges
constexpr int max_macro_depth = 200;

const std::vector<std::string_view>& dict_methods() {
  static const std::vector<std::string_view> names = {"clear", "copy",    "fromkeys",   "get",    "items", "keys",
                                                      "pop",   "popitem", "setdefault", "update", "values"};
  return names;
}
const std::vector<std::string_view>& str_methods() {
  static const std::vector<std::string_view> names = {
      "capitalize", "casefold",     "center",       "count",   "encode",     "endswith",    "expandtabs",
      "find",       "format",       "format_map",   "index",   "isalnum",    "isalpha",     "isascii",
      "isdecimal",  "isdigit",      "isidentifier", "islower", "isnumeric",  "isprintable", "isspace",
      "istitle",    "isupper",      "join",         "ljust",   "lower",      "lstrip",      "maketrans",
      "partition",  "removeprefix", "removesuffix", "replace", "rfind",      "rindex",      "rjust",
      "rpartition", "rsplit",       "rstrip",       "split",   "splitlines", "startswith",  "strip",
      "swapcase",   "title",        "translate",    "upper",   "zfill"};
  return names;
}
const std::vector<std::string_view>& list_methods() {
  static const std::vector<std::string_view> names = {"append", "clear", "copy",   "count",   "extend", "index",
                                                      "insert", "pop",   "remove", "reverse", "sort"};
  return names;
}
bool among(const std::vector<std::string_view>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

class renderer {
 public:
  renderer(const program& tree, const std::vector<std::pair<std::string, value>>& names) : tree_(tree) {
    root_.assign("range", function_value{builtin_function::range});
    root_.assign("namespace", function_value{builtin_function::namespace_});
    root_.assign("dict", function_value{builtin_function::dict});
    root_.assign("raise_exception", function_value{builtin_function::raise_exception});
    root_.assign("strftime_now", function_value{builtin_function::strftime_now});
    for (const auto& [name, v] : names) root_.assign(name, v);
  }

  rendering run() {
    rendering result;
    output_ = &result.text;
    execute(tree_.body, root_, result.text);
    result.generation = std::move(generation_);
    return result;
  }

 private:
  [[nodiscard]] site at(int line) const { return site{tree_.name, line}; }

  // ---- statements ----

  flow execute(const statement_list& body, frame& scope, std::string& out) {
    for (const statement_ptr& s : body) {
      const flow next = execute(*s, scope, out);
      if (next != flow::normal) return next;
    }
    return flow::normal;
  }

  flow execute(const statement& s, frame& scope, std::string& out) {
    switch (s.kind) {
      case statement_kind::text: out += s.text; return flow::normal;
      case statement_kind::output: out += python_str(evaluate(*s.expression, scope), at(s.line)); return flow::normal;
      case statement_kind::if_block:
        for (const conditional_branch& branch : s.branches) {
          if (branch.condition == nullptr || truthy(evaluate(*branch.condition, scope))) {
            return execute(branch.body, scope, out);
          }
        }
        return flow::normal;
      case statement_kind::for_loop: execute_for(s, scope, out); return flow::normal;
      case statement_kind::set: {
        value assigned = evaluate(*s.expression, scope);
        if (!s.attribute.empty()) {
          const value* target = scope.find(s.targets.front());
          if (target == nullptr || !target->is<namespace_value>()) {
            at(s.line).error(
                fmt::format("'{}' is no namespace: only a namespace's attributes can be set", s.targets.front()));
          }
          refuse_private_attribute(s.attribute, at(s.line));
          target->as<namespace_value>().attributes->assign(s.attribute, std::move(assigned));
        } else {
          assign(s.targets, std::move(assigned), scope, s.line);
        }
        return flow::normal;
      }
      case statement_kind::set_block: {
        frame inner{{}, &scope};
        std::string captured;
        execute(s.body, inner, captured);
        scope.assign(s.targets.front(), std::move(captured));
        return flow::normal;
      }
      case statement_kind::macro: scope.assign(s.text, macro_value{&s}); return flow::normal;
      case statement_kind::loop_break: return flow::break_loop;
      case statement_kind::loop_continue: return flow::continue_loop;
      case statement_kind::generation: {
        // transformers' AssistantTracker: the block's place in the text written so far.
        frame inner{{}, &scope};
        const std::size_t begin = out.size();
        execute(s.body, inner, out);
        if (&out == output_) generation_.emplace_back(begin, out.size());
        return flow::normal;
      }
    }
    return flow::normal;
  }

  void assign(const std::vector<std::string>& targets, value assigned, frame& scope, int line) {
    if (targets.size() == 1) {
      scope.assign(targets.front(), std::move(assigned));
      return;
    }
    const value_list items = iterate(assigned, at(line));
    if (items.size() != targets.size()) {
      at(line).error(fmt::format("{} to unpack into {} names",
                                 items.size() > targets.size() ? "too many values" : "not enough values",
                                 targets.size()));
    }
    for (std::size_t k = 0; k < targets.size(); ++k) scope.assign(targets[k], items[k]);
  }

  void execute_for(const statement& s, frame& scope, std::string& out) {
    const value_list all = iterate(evaluate(*s.expression, scope), at(s.line));
    auto kept = std::make_shared<value_list>();
    if (s.loop_filter != nullptr) {
      for (const value& item : all) {
        frame probe{{}, &scope};
        assign(s.targets, item, probe, s.line);
        if (truthy(evaluate(*s.loop_filter, probe))) kept->push_back(item);
      }
    } else {
      *kept = all;
    }
    if (kept->empty()) {
      frame otherwise{{}, &scope};
      execute(s.else_body, otherwise, out);
      return;
    }
    auto state = std::make_shared<loop_state>();
    state->items = kept;
    for (std::size_t k = 0; k < kept->size(); ++k) {
      state->index0 = k;
      frame iteration{{}, &scope};
      assign(s.targets, (*kept)[k], iteration, s.line);
      iteration.assign("loop", loop_value{state});
      if (execute(s.body, iteration, out) == flow::break_loop) break;
    }
  }

  // ---- expressions ----

  value evaluate(const expression& e, frame& scope) {
    const site where = at(e.line);
    switch (e.kind) {
      case expression_kind::literal: return e.constant;
      case expression_kind::name: {
        const value* found = scope.find(e.name);
        if (found == nullptr) return undefined_value{fmt::format("'{}' is undefined", e.name)};
        return *found;
      }
      case expression_kind::list:
      case expression_kind::tuple: {
        value_list items;
        for (const expression_ptr& operand : e.operands) items.push_back(evaluate(*operand, scope));
        return make_list(std::move(items),
                         e.kind == expression_kind::tuple ? sequence_kind::tuple : sequence_kind::list);
      }
      case expression_kind::dict: {
        dict_entries entries;
        for (std::size_t k = 0; k < e.operands.size(); k += 2) {
          const value key = evaluate(*e.operands[k], scope);
          if (!key.is<std::string>()) where.error("loom's dicts take string keys only");
          entries.assign(key.as<std::string>(), evaluate(*e.operands[k + 1], scope));
        }
        return make_dict(std::move(entries));
      }
      case expression_kind::attribute: return attribute(evaluate(*e.operands[0], scope), e.name, where);
      case expression_kind::item: return item(evaluate(*e.operands[0], scope), evaluate(*e.operands[1], scope), where);
      case expression_kind::slice: return slice(e, scope);
      case expression_kind::call: return call(e, scope);
      case expression_kind::filter: {
        const value subject = evaluate(*e.operands[0], scope);
        return filter(e.name, subject, collect(e, scope), where);
      }
      case expression_kind::test: {
        const value subject = evaluate(*e.operands[0], scope);
        return test(e.name, subject, collect(e, scope), where) != e.negated;
      }
      case expression_kind::logical_not: return !truthy(evaluate(*e.operands[0], scope));
      case expression_kind::negative:
      case expression_kind::positive: {
        const value operand = evaluate(*e.operands[0], scope);
        if (operand.is<undefined_value>()) where.error(operand.as<undefined_value>().why);
        if (!is_number(operand)) {
          where.error(fmt::format("bad operand type for unary {}: '{}'",
                                  e.kind == expression_kind::negative ? '-' : '+', type_name(operand)));
        }
        if (e.kind == expression_kind::positive) return operand.is<bool>() ? value(integer_of(operand)) : operand;
        if (operand.is<double>()) return -operand.as<double>();
        if (integer_of(operand) == std::numeric_limits<std::int64_t>::min())
          where.error("an integer overflows 64 bits");
        return -integer_of(operand);
      }
      case expression_kind::arithmetic:
        return arithmetic(e.arithmetic, evaluate(*e.operands[0], scope), evaluate(*e.operands[1], scope), where);
      case expression_kind::compare: {
        value left = evaluate(*e.operands[0], scope);
        for (std::size_t k = 0; k < e.comparisons.size(); ++k) {
          value right = evaluate(*e.operands[k + 1], scope);
          if (!compare(e.comparisons[k], left, right, where)) return false;
          left = std::move(right);
        }
        return true;
      }
      case expression_kind::logical_and: {
        value left = evaluate(*e.operands[0], scope);
        return truthy(left) ? evaluate(*e.operands[1], scope) : left;
      }
      case expression_kind::logical_or: {
        value left = evaluate(*e.operands[0], scope);
        return truthy(left) ? left : evaluate(*e.operands[1], scope);
      }
      case expression_kind::conditional:
        if (truthy(evaluate(*e.operands[1], scope))) return evaluate(*e.operands[0], scope);
        if (e.operands[2] != nullptr) return evaluate(*e.operands[2], scope);
        return undefined_value{"the inline if-expression evaluated to false and no else section was defined."};
      case expression_kind::concat: {
        std::string text;
        for (const expression_ptr& operand : e.operands) text += python_str(evaluate(*operand, scope), where);
        return text;
      }
    }
    return undefined_value{};
  }

  arguments collect(const expression& e, frame& scope) {
    arguments given;
    for (std::size_t k = 1; k < e.operands.size(); ++k) given.positional.push_back(evaluate(*e.operands[k], scope));
    for (const keyword_argument& keyword : e.keywords)
      given.keywords.emplace_back(keyword.name, evaluate(*keyword.argument, scope));
    return given;
  }

  bool compare(compare_operator op, const value& left, const value& right, const site& where) {
    switch (op) {
      case compare_operator::equal: return equal(left, right);
      case compare_operator::not_equal: return !equal(left, right);
      case compare_operator::less: return less(left, right, where);
      case compare_operator::less_equal: return !less(right, left, where);
      case compare_operator::greater: return less(right, left, where);
      case compare_operator::greater_equal: return !less(left, right, where);
      case compare_operator::in: return contains(right, left, where);
      case compare_operator::not_in: return !contains(right, left, where);
    }
    return false;
  }

  // jinja2's getattr: the object's Python attribute (a method) first, then its item.
  value attribute(const value& subject, const std::string& name, const site& where) {
    if (subject.is<undefined_value>()) where.error(subject.as<undefined_value>().why);
    const auto method = [&] { return method_value{std::make_shared<const value>(subject), name}; };
    if (subject.is<dict_value>()) {
      if (among(dict_methods(), name)) return method();
      if (const value* found = subject.as<dict_value>().entries->find(name)) return *found;
      return undefined_value{fmt::format("'dict object' has no attribute '{}'", name)};
    }
    if (subject.is<std::string>() && among(str_methods(), name)) return method();
    if (is_indexable(subject) && among(list_methods(), name)) return method();
    if (subject.is<namespace_value>()) {
      if (const value* found = subject.as<namespace_value>().attributes->find(name)) return *found;
    }
    if (subject.is<loop_value>()) return loop_attribute(*subject.as<loop_value>().state, subject, name);
    return undefined_value{fmt::format("'{}' has no attribute '{}'", object_name(subject), name)};
  }

  static std::string object_name(const value& v) {
    if (v.is<none_value>()) return "None";
    return type_name(v) + " object";
  }

  static value loop_attribute(const loop_state& state, const value& loop, const std::string& name) {
    const auto length = static_cast<std::int64_t>(state.items->size());
    const auto index0 = static_cast<std::int64_t>(state.index0);
    if (name == "index0") return index0;
    if (name == "index") return index0 + 1;
    if (name == "revindex") return length - index0;
    if (name == "revindex0") return length - index0 - 1;
    if (name == "first") return index0 == 0;
    if (name == "last") return index0 == length - 1;
    if (name == "length") return length;
    if (name == "depth") return static_cast<std::int64_t>(state.depth0 + 1);
    if (name == "depth0") return static_cast<std::int64_t>(state.depth0);
    if (name == "previtem") {
      if (index0 == 0) return undefined_value{"there is no previous item"};
      return (*state.items)[state.index0 - 1];
    }
    if (name == "nextitem") {
      if (index0 + 1 >= length) return undefined_value{"there is no next item"};
      return (*state.items)[state.index0 + 1];
    }
    if (name == "cycle") return method_value{std::make_shared<const value>(loop), name};
    return undefined_value{fmt::format("'LoopContext object' has no attribute '{}'", name)};
  }

  // jinja2's getitem: the item first, then (for a string key) the attribute.
  value item(const value& subject, const value& key, const site& where) {
    if (subject.is<undefined_value>()) where.error(subject.as<undefined_value>().why);
    if (subject.is<dict_value>()) {
      if (key.is<std::string>()) {
        if (const value* found = subject.as<dict_value>().entries->find(key.as<std::string>())) return *found;
        return attribute(subject, key.as<std::string>(), where);
      }
      return undefined_value{fmt::format("'dict object' has no attribute {}", python_repr(key, where))};
    }
    if ((is_indexable(subject) || subject.is<std::string>()) && is_integer(key)) {
      std::int64_t index = integer_of(key);
      if (subject.is<std::string>()) {
        const std::vector<std::uint32_t> points = code_points(subject.as<std::string>());
        const auto size = static_cast<std::int64_t>(points.size());
        if (index < 0) index += size;
        if (index < 0 || index >= size)
          return undefined_value{"'str object' has no element " + std::to_string(integer_of(key))};
        return from_code_points(points, static_cast<std::size_t>(index), static_cast<std::size_t>(index) + 1);
      }
      const value_list& items = items_of(subject);
      const auto size = static_cast<std::int64_t>(items.size());
      if (index < 0) index += size;
      if (index < 0 || index >= size) {
        return undefined_value{fmt::format("'{} object' has no element {}", type_name(subject), integer_of(key))};
      }
      return items[static_cast<std::size_t>(index)];
    }
    if (key.is<std::string>()) return attribute(subject, key.as<std::string>(), where);
    return undefined_value{fmt::format("'{}' has no element {}", object_name(subject), python_repr(key, where))};
  }

  value slice(const expression& e, frame& scope) {
    const site where = at(e.line);
    const value subject = evaluate(*e.operands[0], scope);
    bool bounds_are_integers = true;
    const auto bound = [&](std::size_t k) -> std::optional<std::int64_t> {
      if (e.operands[k] == nullptr) return std::nullopt;
      const value v = evaluate(*e.operands[k], scope);
      if (v.is<none_value>()) return std::nullopt;
      if (!is_integer(v)) {
        bounds_are_integers = false;
        return std::nullopt;
      }
      return integer_of(v);
    };
    const std::optional<std::int64_t> start = bound(1);
    const std::optional<std::int64_t> stop = bound(2);
    const std::int64_t step = bound(3).value_or(1);
    if (subject.is<undefined_value>()) where.error(subject.as<undefined_value>().why);
    const bool is_text = subject.is<std::string>();
    // jinja2 slices with Python's own subscript, not its getitem: what cannot be sliced is an error
    if (subject.is<dict_value>()) where.error("unhashable type: 'slice'");
    if (!is_text && !is_indexable(subject)) {
      where.error(fmt::format("'{}' object is not subscriptable", type_name(subject)));
    }
    if (!bounds_are_integers) where.error("slice indices must be integers or None or have an __index__ method");
    if (step == 0) where.error("slice step cannot be zero");

    std::vector<std::uint32_t> points;
    if (is_text) points = code_points(subject.as<std::string>());
    const auto size = static_cast<std::int64_t>(is_text ? points.size() : items_of(subject).size());
    // Python's PySlice_AdjustIndices.
    const auto adjust = [&](std::optional<std::int64_t> index, std::int64_t fallback) {
      if (!index) return fallback;
      std::int64_t i = *index;
      if (i < 0) {
        i += size;
        if (i < 0) i = step < 0 ? -1 : 0;
      } else if (i >= size) {
        i = step < 0 ? size - 1 : size;
      }
      return i;
    };
    const std::int64_t first = adjust(start, step < 0 ? size - 1 : 0);
    const std::int64_t last = adjust(stop, step < 0 ? -1 : size);
    std::vector<std::size_t> picked;
    for (std::int64_t i = first; step > 0 ? i < last : i > last; i += step)
      picked.push_back(static_cast<std::size_t>(i));
    if (is_text) {
      std::string text;
      for (const std::size_t k : picked) detail::append_utf8(text, points[k]);
      return text;
    }
    value_list items;
    for (const std::size_t k : picked) items.push_back(items_of(subject)[k]);
    return make_list(std::move(items), subject.as<sequence_value>().kind);
  }

  value arithmetic(arithmetic_operator op, const value& a, const value& b, const site& where) {
    if (a.is<undefined_value>()) where.error(a.as<undefined_value>().why);
    if (b.is<undefined_value>()) where.error(b.as<undefined_value>().why);
    static constexpr std::string_view symbols[] = {"+", "-", "*", "/", "//", "%", "**"};
    const auto unsupported = [&] {
      where.error(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", symbols[static_cast<int>(op)],
                              type_name(a), type_name(b)));
    };
    const auto overflow = [&] { where.error("an integer overflows 64 bits"); };
    if (is_number(a) && is_number(b)) {
      if (is_integer(a) && is_integer(b) && op != arithmetic_operator::divide) {
        const std::int64_t x = integer_of(a);
        const std::int64_t y = integer_of(b);
        std::int64_t result = 0;
        switch (op) {
          case arithmetic_operator::add:
            if (__builtin_add_overflow(x, y, &result)) overflow();
            return result;
          case arithmetic_operator::subtract:
            if (__builtin_sub_overflow(x, y, &result)) overflow();
            return result;
          case arithmetic_operator::multiply:
            if (__builtin_mul_overflow(x, y, &result)) overflow();
            return result;
          case arithmetic_operator::floor_divide:
          case arithmetic_operator::modulo: {
            if (y == 0) where.error("integer division or modulo by zero");
            if (x == std::numeric_limits<std::int64_t>::min() && y == -1) overflow();
            std::int64_t quotient = x / y;
            std::int64_t remainder = x % y;
            if (remainder != 0 && ((remainder < 0) != (y < 0))) {
              --quotient;
              remainder += y;
            }
            return op == arithmetic_operator::floor_divide ? quotient : remainder;
          }
          case arithmetic_operator::power: {
            if (y < 0) {
              if (x == 0) where.error("0.0 cannot be raised to a negative power");
              return std::pow(static_cast<double>(x), static_cast<double>(y));
            }
            result = 1;
            for (std::int64_t k = 0; k < y; ++k) {
              if (__builtin_mul_overflow(result, x, &result)) overflow();
              if (result == 0 || result == 1) break;
            }
            return result;
          }
          default: break;
        }
      }
      const double x = float_of(a);
      const double y = float_of(b);
      switch (op) {
        case arithmetic_operator::add: return x + y;
        case arithmetic_operator::subtract: return x - y;
        case arithmetic_operator::multiply: return x * y;
        case arithmetic_operator::divide:
          if (y == 0) where.error("division by zero");
          return x / y;
        case arithmetic_operator::floor_divide:
        case arithmetic_operator::modulo: {
          if (y == 0) where.error("float division by zero");
          // CPython's float_divmod
          double mod = std::fmod(x, y);
          double div = (x - mod) / y;
          if (mod != 0) {
            if ((y < 0) != (mod < 0)) {
              mod += y;
              div -= 1.0;
            }
          } else {
            mod = std::copysign(0.0, y);
          }
          double floor_div = 0;
          if (div != 0) {
            floor_div = std::floor(div);
            if (div - floor_div > 0.5) floor_div += 1.0;
          } else {
            floor_div = std::copysign(0.0, x / y);
          }
          return op == arithmetic_operator::floor_divide ? floor_div : mod;
        }
        case arithmetic_operator::power:
          if (x == 0 && y < 0) where.error("0.0 cannot be raised to a negative power");
          return std::pow(x, y);
      }
    }
    const auto repeat = [&](const value& sequence, std::int64_t times) -> value {
      const std::size_t size =
          sequence.is<std::string>() ? sequence.as<std::string>().size() : items_of(sequence).size();
      if (times > 0 && size > 0 && static_cast<std::uint64_t>(times) > (std::uint64_t{1} << 30) / size) {
        where.error("a repetition ('*') would make more than 2^30 bytes or items");
      }
      if (sequence.is<std::string>()) {
        std::string text;
        for (std::int64_t k = 0; k < times; ++k) text += sequence.as<std::string>();
        return text;
      }
      value_list items;
      for (std::int64_t k = 0; k < times; ++k) {
        items.insert(items.end(), items_of(sequence).begin(), items_of(sequence).end());
      }
      return make_list(std::move(items), sequence.as<sequence_value>().kind);
    };
    switch (op) {
      case arithmetic_operator::add:
        if (a.is<std::string>() && b.is<std::string>()) return a.as<std::string>() + b.as<std::string>();
        if (is_indexable(a) && is_indexable(b) && a.as<sequence_value>().kind == b.as<sequence_value>().kind) {
          value_list items = items_of(a);
          items.insert(items.end(), items_of(b).begin(), items_of(b).end());
          return make_list(std::move(items), a.as<sequence_value>().kind);
        }
        break;
      case arithmetic_operator::multiply:
        if ((a.is<std::string>() || is_indexable(a)) && is_integer(b)) return repeat(a, integer_of(b));
        if (is_integer(a) && (b.is<std::string>() || is_indexable(b))) return repeat(b, integer_of(a));
        break;
      case arithmetic_operator::modulo:
        if (a.is<std::string>()) return percent_format(a.as<std::string>(), b, where);
        break;
      default: break;
    }
    unsupported();
    return {};
  }

  // Python's printf-style str % args, for %s, %d and %%.
  std::string percent_format(const std::string& format, const value& args, const site& where) {
    const value_list items = is_kind(args, sequence_kind::tuple) ? items_of(args) : value_list{args};
    // Python takes a non-tuple argument with __getitem__ (a list, a dict) as a mapping, which %s and %d
    // do not use: no complaint that it went unused.
    const bool as_mapping = !is_kind(args, sequence_kind::tuple) && (args.is<dict_value>() || is_indexable(args));
    std::string out;
    std::size_t used = 0;
    for (std::size_t k = 0; k < format.size(); ++k) {
      if (format[k] != '%') {
        out += format[k];
        continue;
      }
      const char spec = k + 1 < format.size() ? format[++k] : '\0';
      if (spec == '%') {
        out += '%';
        continue;
      }
      if (spec != 's' && spec != 'd' && spec != 'i') where.error("loom's str % formatting knows %s, %d and %% only");
      if (used >= items.size()) where.error("not enough arguments for format string");
      const value& argument = items[used++];
      if (spec == 's') {
        out += python_str(argument, where);
      } else if (is_number(argument)) {
        out += std::to_string(argument.is<double>() ? static_cast<std::int64_t>(argument.as<double>())
                                                    : integer_of(argument));
      } else {
        where.error(fmt::format("%d format: a real number is required, not {}", type_name(argument)));
      }
    }
    if (used < items.size() && !(used == 0 && as_mapping)) {
      where.error("not all arguments converted during string formatting");
    }
    return out;
  }

  // ---- calls ----

  value call(const expression& e, frame& scope) {
    const site where = at(e.line);
    const value callee = evaluate(*e.operands[0], scope);
    const arguments given = collect(e, scope);
    if (callee.is<method_value>()) return call_method(callee.as<method_value>(), given, where);
    if (callee.is<macro_value>()) return call_macro(*callee.as<macro_value>().definition, given, where);
    if (callee.is<function_value>()) return call_builtin(callee.as<function_value>().which, given, where);
    if (callee.is<undefined_value>()) where.error(callee.as<undefined_value>().why);
    where.error(fmt::format("'{}' object is not callable", type_name(callee)));
  }

  value call_macro(const statement& definition, const arguments& given, const site& where) {
    if (macro_depth_ >= max_macro_depth)
      where.error(fmt::format("macros call each other more than {} deep", max_macro_depth));
    const std::vector<macro_parameter>& parameters = definition.parameters;
    if (given.positional.size() > parameters.size()) {
      where.error(fmt::format("macro '{}' takes not more than {}", definition.text,
                              counted(static_cast<std::int64_t>(parameters.size()), "argument")));
    }
    frame call_frame{{}, &root_};
    std::vector<bool> bound(parameters.size(), false);
    for (std::size_t k = 0; k < given.positional.size(); ++k) {
      call_frame.assign(parameters[k].name, given.positional[k]);
      bound[k] = true;
    }
    for (const auto& keyword : given.keywords) {
      const auto& [name, argument] = keyword;
      // By the pair's member: clang before 16 captures no structured binding.
      const auto found =
          std::find_if(parameters.begin(), parameters.end(), [&](const auto& p) { return p.name == keyword.first; });
      if (found == parameters.end())
        where.error(fmt::format("macro '{}' takes no keyword argument '{}'", definition.text, name));
      const auto k = static_cast<std::size_t>(found - parameters.begin());
      if (bound[k]) where.error(fmt::format("macro '{}' got multiple values for argument '{}'", definition.text, name));
      call_frame.assign(name, argument);
      bound[k] = true;
    }
    for (std::size_t k = 0; k < parameters.size(); ++k) {
      if (bound[k]) continue;
      if (parameters[k].default_value != nullptr) {
        call_frame.assign(parameters[k].name, evaluate(*parameters[k].default_value, call_frame));
      } else {
        call_frame.assign(parameters[k].name,
                          undefined_value{fmt::format("parameter '{}' was not provided", parameters[k].name)});
      }
    }
    ++macro_depth_;
    std::string text;
    execute(definition.body, call_frame, text);
    --macro_depth_;
    return text;
  }

  value call_builtin(builtin_function which, const arguments& given, const site& where) {
    switch (which) {
      case builtin_function::range: {
        if (!given.keywords.empty() || given.positional.empty() || given.positional.size() > 3) {
          where.error("range takes 1 to 3 positional arguments");
        }
        for (const value& argument : given.positional) {
          if (!is_integer(argument)) where.error(fmt::format("range takes integers, not '{}'", type_name(argument)));
        }
        const std::size_t n = given.positional.size();
        const std::int64_t start = n == 1 ? 0 : integer_of(given.positional[0]);
        const std::int64_t stop = integer_of(given.positional[n == 1 ? 0 : 1]);
        const std::int64_t step = n == 3 ? integer_of(given.positional[2]) : 1;
        if (step == 0) where.error("range() arg 3 must not be zero");
        value_list items;
        for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
          if (static_cast<std::int64_t>(items.size()) >= max_range) {
            where.error("range is too big: the sandbox blocks ranges larger than 100000");
          }
          items.emplace_back(i);
        }
        return make_list(std::move(items));
      }
      case builtin_function::namespace_:
      case builtin_function::dict: {
        dict_entries entries;
        if (given.positional.size() > 1) where.error("namespace() and dict() take at most one positional argument");
        if (given.positional.size() == 1) {
          const value& from = given.positional.front();
          if (from.is<dict_value>()) {
            entries = *from.as<dict_value>().entries;
          } else {
            for (const value& pair : iterate(from, where)) {
              const value_list parts = iterate(pair, where);
              if (parts.size() != 2 || !parts[0].is<std::string>()) where.error("dict() takes pairs with string keys");
              entries.assign(parts[0].as<std::string>(), parts[1]);
            }
          }
        }
        for (const auto& [name, argument] : given.keywords) entries.assign(name, argument);
        if (which == builtin_function::dict) return make_dict(std::move(entries));
        for (const auto& entry : entries.items) refuse_private_attribute(entry.first, where);
        return namespace_value{std::make_shared<dict_entries>(std::move(entries))};
      }
      case builtin_function::raise_exception: {
        const bound_arguments bound(given, "raise_exception", {"message"}, where);
        where.error("the template raised an exception: " + python_str(bound.get(0, ""), where));
      }
      case builtin_function::strftime_now: {
        const bound_arguments bound(given, "strftime_now", {"format"}, where);
        const value format = bound.get(0, undefined_value{"strftime_now takes a format"});
        if (!format.is<std::string>()) where.error("strftime_now takes a format string");
        const std::time_t now = std::time(nullptr);
        std::tm local{};
        localtime_r(&now, &local);
        std::string buffer(256, '\0');
        while (true) {
          const std::size_t written =
              std::strftime(buffer.data(), buffer.size(), format.as<std::string>().c_str(), &local);
          if (written > 0 || format.as<std::string>().empty() || buffer.size() > 65536) {
            buffer.resize(written);
            return buffer;
          }
          buffer.resize(buffer.size() * 4);
        }
      }
    }
    return {};
  }

  value call_method(const method_value& method, const arguments& given, const site& where) {
    const value& self = *method.self;
    const std::string& name = method.name;
    const std::string callee = fmt::format("{}.{}()", type_name(self), name);
    if (self.is<std::string>()) return call_str_method(self.as<std::string>(), name, given, callee, where);
    if (self.is<dict_value>()) {
      const dict_entries& entries = *self.as<dict_value>().entries;
      if (name == "get") {
        const bound_arguments bound(given, callee, {"key", "default"}, where);
        const value key = bound.get(0, undefined_value{});
        if (key.is<std::string>()) {
          if (const value* found = entries.find(key.as<std::string>())) return *found;
        }
        return bound.get(1, none_value{});
      }
      if (name == "items" || name == "keys" || name == "values") {
        const bound_arguments bound(given, callee, {}, where);
        value_list items;
        for (const auto& [key, v] : entries.items) {
          if (name == "items") {
            items.push_back(make_list({value(key), v}, sequence_kind::tuple));
          } else {
            items.push_back(name == "keys" ? value(key) : v);
          }
        }
        return make_list(std::move(items), name == "items"  ? sequence_kind::dict_items
                                           : name == "keys" ? sequence_kind::dict_keys
                                                            : sequence_kind::dict_values);
      }
    }
    if (is_indexable(self) && name == "count") {
      const bound_arguments bound(given, callee, {"value"}, where);
      const value needle = bound.get(0, undefined_value{});
      const value_list& items = items_of(self);
      return static_cast<std::int64_t>(
          std::count_if(items.begin(), items.end(), [&](const value& x) { return equal(x, needle); }));
    }
    if (self.is<loop_value>() && name == "cycle") {
      if (given.positional.empty()) where.error("loop.cycle() takes at least one argument");
      return given.positional[self.as<loop_value>().state->index0 % given.positional.size()];
    }
    where.error(
        fmt::format("{} is not supported (transformers' sandbox refuses what changes a list or a dict)", callee));
  }

  static value split_list(value_list parts) { return make_list(std::move(parts)); }

  value call_str_method(const std::string& text, const std::string& name, const arguments& given,
                        const std::string& callee, const site& where) {
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const bound_arguments bound(given, callee, {"chars"}, where);
      const value chars = bound.get(0, none_value{});
      const std::vector<std::uint32_t> set = strip_set(chars, where);
      return python_strip(text, chars.is<std::string>() ? &set : nullptr, name != "rstrip", name != "lstrip");
    }
    if (name == "split" || name == "rsplit") {
      const bound_arguments bound(given, callee, {"sep", "maxsplit"}, where);
      const value limit = bound.get(1, std::int64_t{-1});
      if (!is_integer(limit)) where.error("maxsplit must be an integer");
      return split_list(python_split(text, bound.get(0, none_value{}), integer_of(limit), name == "rsplit", where));
    }
    if (name == "startswith" || name == "endswith") {
      const bound_arguments bound(given, callee, {"prefix"}, where);
      const value affix = bound.get(0, undefined_value{});
      const auto matches = [&](const value& candidate) {
        if (!candidate.is<std::string>()) where.error(fmt::format("{} takes a string or a tuple of strings", callee));
        return name == "startswith" ? std::string_view(text).starts_with(candidate.as<std::string>())
                                    : std::string_view(text).ends_with(candidate.as<std::string>());
      };
      if (is_kind(affix, sequence_kind::tuple)) {
        const value_list& options = items_of(affix);
        return std::any_of(options.begin(), options.end(), matches);
      }
      return matches(affix);
    }
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
      const bound_arguments bound(given, callee, {}, where);
      if (name == "upper") return upper(text);
      if (name == "lower") return lower(text);
      return name == "title" ? python_title(text) : python_capitalize(text);
    }
    if (name == "replace") {
      const bound_arguments bound(given, callee, {"old", "new", "count"}, where);
      const value old_text = bound.get(0, undefined_value{});
      const value new_text = bound.get(1, undefined_value{});
      const value count = bound.get(2, std::int64_t{-1});
      if (!old_text.is<std::string>() || !new_text.is<std::string>() || !is_integer(count)) {
        where.error("str.replace() takes two strings and a count");
      }
      return python_replace(text, old_text.as<std::string>(), new_text.as<std::string>(), integer_of(count));
    }
    if (name == "find" || name == "rfind" || name == "count") {
      const bound_arguments bound(given, callee, {"sub"}, where);
      const value sub = bound.get(0, undefined_value{});
      if (!sub.is<std::string>()) where.error(fmt::format("{} takes a string", callee));
      const std::string& needle = sub.as<std::string>();
      if (name == "count") {
        if (needle.empty()) return static_cast<std::int64_t>(code_point_count(text)) + 1;
        std::int64_t count = 0;
        for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size()))
          ++count;
        return count;
      }
      const std::size_t at = name == "find" ? text.find(needle) : text.rfind(needle);
      return at == std::string::npos ? std::int64_t{-1} : code_point_index(text, at);
    }
    if (name == "join") {
      const bound_arguments bound(given, callee, {"iterable"}, where);
      std::string out;
      bool first = true;
      for (const value& part : iterate(bound.get(0, undefined_value{"str.join() takes an iterable"}), where)) {
        if (!part.is<std::string>()) where.error(fmt::format("str.join() expected str, found {}", type_name(part)));
        if (!first) out += text;
        out += part.as<std::string>();
        first = false;
      }
      return out;
    }
    if (name == "splitlines") {
      const bound_arguments bound(given, callee, {}, where);
      value_list lines;
      for (std::string& line : python_splitlines(text)) lines.emplace_back(std::move(line));
      return make_list(std::move(lines));
    }
    if (name == "format") return str_format(text, given, where);
    where.error(fmt::format("{} is not supported", callee));
  }

  // Python's str.format() for {}, {0} and {name} fields (no conversions or format specs).
  std::string str_format(const std::string& format, const arguments& given, const site& where) {
    std::string out;
    std::size_t next_automatic = 0;
    for (std::size_t k = 0; k < format.size(); ++k) {
      const char c = format[k];
      if ((c == '{' || c == '}') && k + 1 < format.size() && format[k + 1] == c) {
        out += c;
        ++k;
        continue;
      }
      if (c == '}') where.error("str.format(): a single '}' in the format");
      if (c != '{') {
        out += c;
        continue;
      }
      const std::size_t close = format.find('}', k);
      if (close == std::string::npos) where.error("str.format(): a '{' is not closed");
      const std::string field = format.substr(k + 1, close - k - 1);
      if (field.find_first_of("!:.[") != std::string::npos)
        where.error("loom's str.format() takes {}, {n} and {name} only");
      const value* argument = nullptr;
      if (field.empty() || std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
        const std::size_t index = field.empty() ? next_automatic++ : static_cast<std::size_t>(std::stoul(field));
        if (index >= given.positional.size()) where.error("str.format(): replacement index out of range");
        argument = &given.positional[index];
      } else {
        for (const auto& [name, v] : given.keywords) {
          if (name == field) argument = &v;
        }
        if (argument == nullptr) where.error(fmt::format("str.format(): no argument named '{}'", field));
      }
      out += python_str(*argument, where);
      k = close;
    }
    return out;
  }

  // ---- tests ----

  bool test(const std::string& name, const value& subject, const arguments& given, const site& where) {
    const auto other = [&] {
      const bound_arguments bound(given, "the test '" + name + "'", {"other"}, where);
      return bound.get(0, undefined_value{fmt::format("the test '{}' takes an argument", name)});
    };
    const auto no_arguments = [&] { const bound_arguments bound(given, "the test '" + name + "'", {}, where); };
    if (name == "eq" || name == "equalto" || name == "==") return equal(subject, other());
    if (name == "ne" || name == "!=") return !equal(subject, other());
    if (name == "lt" || name == "lessthan" || name == "<") return less(subject, other(), where);
    if (name == "le" || name == "<=") return !less(other(), subject, where);
    if (name == "gt" || name == "greaterthan" || name == ">") return less(other(), subject, where);
    if (name == "ge" || name == ">=") return !less(subject, other(), where);
    if (name == "in") return contains(other(), subject, where);
    if (name == "sameas") {
      const value x = other();
      if (subject.is<none_value>() || subject.is<bool>())
        return equal(subject, x) && subject.data.index() == x.data.index();
      return false;
    }
    if (name == "divisibleby" || name == "odd" || name == "even") {
      const value divisor = name == "divisibleby" ? other() : value(std::int64_t{2});
      if (name != "divisibleby") no_arguments();
      const value remainder = arithmetic(arithmetic_operator::modulo, subject, divisor, where);
      return equal(remainder, value(name == "odd" ? 1 : 0));
    }
    no_arguments();
    if (name == "defined") return !subject.is<undefined_value>();
    if (name == "undefined") return subject.is<undefined_value>();
    if (name == "none") return subject.is<none_value>();
    if (name == "boolean") return subject.is<bool>();
    if (name == "true") return subject.is<bool>() && subject.as<bool>();
    if (name == "false") return subject.is<bool>() && !subject.as<bool>();
    if (name == "string") return subject.is<std::string>();
    if (name == "number") return is_number(subject);
    if (name == "integer") return subject.is<std::int64_t>();
    if (name == "float") return subject.is<double>();
    if (name == "mapping") return subject.is<dict_value>();
    if (name == "iterable") {
      return subject.is<undefined_value>() || subject.is<std::string>() || subject.is<sequence_value>() ||
             subject.is<dict_value>() || subject.is<loop_value>();
    }
    if (name == "sequence") {
      return subject.is<undefined_value>() || subject.is<std::string>() || is_indexable(subject) ||
             subject.is<dict_value>();
    }
    if (name == "callable") {
      // jinja2's Undefined has a __call__ (that fails): callable() holds for it
      return subject.is<undefined_value>() || subject.is<macro_value>() || subject.is<method_value>() ||
             subject.is<function_value>();
    }
    where.error(fmt::format("no test named '{}'", name));
  }

  // ---- filters ----

  // The attribute (dotted, with numbers as indexes) that selectattr, map, sort and the like read.
  value attribute_path(const value& subject, const value& path, const site& where) {
    if (is_integer(path)) return item(subject, path, where);
    if (!path.is<std::string>()) where.error("an attribute's name must be a string or an integer");
    value current = subject;
    const std::string& dotted = path.as<std::string>();
    for (std::size_t start = 0; start <= dotted.size();) {
      const std::size_t end = std::min(dotted.find('.', start), dotted.size());
      const std::string part = dotted.substr(start, end - start);
      if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        current = item(current, value(static_cast<std::int64_t>(std::stoll(part))), where);
      } else {
        current = item(current, value(part), where);
      }
      start = end + 1;
    }
    return current;
  }

  // Python's key for jinja2's case-insensitive sorting and unique: strings lower-cased.
  static value ignore_case(const value& v) { return v.is<std::string>() ? value(lower(v.as<std::string>())) : v; }

  value_list select(const value& sequence, const arguments& given, bool by_attribute, bool keep, const site& where) {
    std::size_t next = 0;
    std::optional<value> path;
    if (by_attribute) {
      if (given.positional.empty()) where.error("selectattr and rejectattr take an attribute's name");
      path = given.positional[next++];
    }
    std::optional<std::string> test_name;
    if (next < given.positional.size()) {
      const value& named = given.positional[next++];
      if (!named.is<std::string>()) where.error("a test's name must be a string");
      test_name = named.as<std::string>();
      const auto& tests = supported_tests();
      if (!among(tests, *test_name) && *test_name != "==" && *test_name != "!=" && *test_name != "<" &&
          *test_name != "<=" && *test_name != ">" && *test_name != ">=") {
        where.error(fmt::format("the test '{}' is not supported", *test_name));
      }
    }
    arguments test_arguments;
    test_arguments.positional.assign(given.positional.begin() + static_cast<std::ptrdiff_t>(next),
                                     given.positional.end());
    test_arguments.keywords = given.keywords;
    value_list kept;
    for (const value& candidate : iterate(sequence, where)) {
      const value subject = path ? attribute_path(candidate, *path, where) : candidate;
      const bool passes = test_name ? test(*test_name, subject, test_arguments, where) : truthy(subject);
      if (passes == keep) kept.push_back(candidate);
    }
    return kept;
  }

  value filter(const std::string& name, const value& subject, const arguments& given, const site& where) {
    const std::string callee = "the filter '" + name + "'";
    const auto text_of = [&](const value& v) { return python_str(v, where); };
    if (name == "trim") {
      const bound_arguments bound(given, callee, {"chars"}, where);
      const value chars = bound.get(0, none_value{});
      const std::vector<std::uint32_t> set = strip_set(chars, where);
      return python_strip(text_of(subject), chars.is<std::string>() ? &set : nullptr, true, true);
    }
    if (name == "tojson") return tojson(subject, given, callee, where);
    if (name == "length" || name == "count") {
      const bound_arguments bound(given, callee, {}, where);
      return length_of(subject, where);
    }
    if (name == "first") {
      const bound_arguments bound(given, callee, {}, where);
      const value_list items = iterate(subject, where);
      if (items.empty()) return undefined_value{"No first item, sequence was empty."};
      return items.front();
    }
    if (name == "last") {
      const bound_arguments bound(given, callee, {}, where);
      if (is_kind(subject, sequence_kind::generator)) where.error("'generator' object is not reversible");
      const value_list items = iterate(subject, where);
      if (items.empty()) return undefined_value{"No last item, sequence was empty."};
      return items.back();
    }
    if (name == "join") {
      const bound_arguments bound(given, callee, {"d", "attribute"}, where);
      const std::string separator = text_of(bound.get(0, ""));
      const value path = bound.get(1, none_value{});
      std::string out;
      bool first = true;
      for (const value& part : iterate(subject, where)) {
        if (!first) out += separator;
        out += text_of(path.is<none_value>() ? part : attribute_path(part, path, where));
        first = false;
      }
      return out;
    }
    if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
      const bool by_attribute = name.ends_with("attr");
      return make_list(select(subject, given, by_attribute, name.starts_with("select"), where),
                       sequence_kind::generator);
    }
    if (name == "map") return map(subject, given, where);
    if (name == "list") {
      const bound_arguments bound(given, callee, {}, where);
      return make_list(iterate(subject, where));
    }
    if (name == "string") {
      const bound_arguments bound(given, callee, {}, where);
      return text_of(subject);
    }
    if (name == "safe") {
      const bound_arguments bound(given, callee, {}, where);
      return text_of(subject);
    }
    if (name == "e" || name == "escape") {
      const bound_arguments bound(given, callee, {}, where);
      return html_escape(text_of(subject));
    }
    if ((name == "int" || name == "float") && subject.is<undefined_value>()) {
      where.error(subject.as<undefined_value>().why);  // Undefined's __int__ and __float__ fail
    }
    if (name == "int") {
      const bound_arguments bound(given, callee, {"default", "base"}, where);
      const value fallback = bound.get(0, std::int64_t{0});
      const value base = bound.get(1, std::int64_t{10});
      if (subject.is<std::string>()) {
        if (!is_integer(base)) where.error("int's base must be an integer");
        if (auto number = parse_python_int(subject.as<std::string>(), static_cast<int>(integer_of(base))))
          return *number;
        if (auto number = parse_python_float(subject.as<std::string>()); number && std::isfinite(*number)) {
          return static_cast<std::int64_t>(*number);
        }
        return fallback;
      }
      if (is_integer(subject)) return integer_of(subject);
      if (subject.is<double>() && std::isfinite(subject.as<double>()))
        return static_cast<std::int64_t>(subject.as<double>());
      return fallback;
    }
    if (name == "float") {
      const bound_arguments bound(given, callee, {"default"}, where);
      if (is_number(subject)) return float_of(subject);
      if (subject.is<std::string>()) {
        if (auto number = parse_python_float(subject.as<std::string>())) return *number;
      }
      return bound.get(0, 0.0);
    }
    if (name == "lower" || name == "upper" || name == "capitalize" || name == "title") {
      const bound_arguments bound(given, callee, {}, where);
      const std::string text = text_of(subject);
      if (name == "lower") return lower(text);
      if (name == "upper") return upper(text);
      return name == "capitalize" ? python_capitalize(text) : jinja_title(text);
    }
    if (name == "replace") {
      const bound_arguments bound(given, callee, {"old", "new", "count"}, where);
      const value count = bound.get(2, none_value{});
      if (!count.is<none_value>() && !is_integer(count)) where.error("replace's count must be an integer");
      return python_replace(text_of(subject), text_of(bound.get(0, undefined_value{})),
                            text_of(bound.get(1, undefined_value{})), count.is<none_value>() ? -1 : integer_of(count));
    }
    if (name == "default" || name == "d") {
      const bound_arguments bound(given, callee, {"default_value", "boolean"}, where);
      const bool by_truth = truthy(bound.get(1, false));
      if (subject.is<undefined_value>() || (by_truth && !truthy(subject))) return bound.get(0, "");
      return subject;
    }
    if (name == "items") {
      const bound_arguments bound(given, callee, {}, where);
      if (subject.is<undefined_value>()) return make_list({}, sequence_kind::generator);
      if (!subject.is<dict_value>()) where.error("Can only get item pairs from a mapping.");
      value_list pairs;
      for (const auto& [key, v] : subject.as<dict_value>().entries->items)
        pairs.push_back(make_list({value(key), v}, sequence_kind::tuple));
      return make_list(std::move(pairs), sequence_kind::generator);
    }
    if (name == "dictsort") {
      const bound_arguments bound(given, callee, {"case_sensitive", "by", "reverse"}, where);
      if (!subject.is<dict_value>()) where.error("dictsort takes a dict");
      const bool case_sensitive = truthy(bound.get(0, false));
      const value by = bound.get(1, "key");
      if (!by.is<std::string>() || (by.as<std::string>() != "key" && by.as<std::string>() != "value")) {
        where.error("You can only sort by either \"key\" or \"value\"");
      }
      const std::size_t position = by.as<std::string>() == "key" ? 0 : 1;
      value_list pairs;
      for (const auto& [key, v] : subject.as<dict_value>().entries->items)
        pairs.push_back(make_list({value(key), v}, sequence_kind::tuple));
      sort_values(
          pairs, truthy(bound.get(2, false)),
          [&](const value& pair) {
            const value& key = items_of(pair)[position];
            return case_sensitive ? key : ignore_case(key);
          },
          where);
      return make_list(std::move(pairs));
    }
    if (name == "sort") {
      const bound_arguments bound(given, callee, {"reverse", "case_sensitive", "attribute"}, where);
      const bool case_sensitive = truthy(bound.get(1, false));
      const value path = bound.get(2, none_value{});
      value_list items = iterate(subject, where);
      sort_values(
          items, truthy(bound.get(0, false)),
          [&](const value& v) {
            const value key = path.is<none_value>() ? v : attribute_path(v, path, where);
            return case_sensitive ? key : ignore_case(key);
          },
          where);
      return make_list(std::move(items));
    }
    if (name == "unique") {
      const bound_arguments bound(given, callee, {"case_sensitive", "attribute"}, where);
      const bool case_sensitive = truthy(bound.get(0, false));
      const value path = bound.get(1, none_value{});
      value_list kept;
      value_list seen;
      for (const value& v : iterate(subject, where)) {
        value key = path.is<none_value>() ? v : attribute_path(v, path, where);
        if (!case_sensitive) key = ignore_case(key);
        if (std::any_of(seen.begin(), seen.end(), [&](const value& s) { return equal(s, key); })) continue;
        seen.push_back(std::move(key));
        kept.push_back(v);
      }
      return make_list(std::move(kept), sequence_kind::generator);
    }
    if (name == "reverse") {
      const bound_arguments bound(given, callee, {}, where);
      if (subject.is<std::string>()) {
        std::vector<std::uint32_t> points = code_points(subject.as<std::string>());
        std::reverse(points.begin(), points.end());
        return from_code_points(points);
      }
      value_list items = iterate(subject, where);
      std::reverse(items.begin(), items.end());
      // reversed() of a list or dict is an iterator; of a generator, jinja2 makes a list
      return make_list(std::move(items),
                       is_kind(subject, sequence_kind::generator) ? sequence_kind::list : sequence_kind::generator);
    }
    if (name == "abs") {
      const bound_arguments bound(given, callee, {}, where);
      if (subject.is<double>()) return std::fabs(subject.as<double>());
      if (is_integer(subject)) {
        if (integer_of(subject) == std::numeric_limits<std::int64_t>::min())
          where.error("an integer overflows 64 bits");
        return std::abs(integer_of(subject));
      }
      where.error(fmt::format("bad operand type for abs(): '{}'", type_name(subject)));
    }
    if (name == "indent") return indent(subject, given, callee, where);
    if (name == "center") {
      const bound_arguments bound(given, callee, {"width"}, where);
      const value width = bound.get(0, std::int64_t{80});
      if (!is_integer(width)) where.error("center's width must be an integer");
      const std::string text = text_of(subject);
      const auto length = static_cast<std::int64_t>(code_point_count(text));
      const std::int64_t margin = integer_of(width) - length;
      if (margin <= 0) return text;
      // CPython's pad(): the odd space goes left when the width is odd
      const std::int64_t left = margin / 2 + (margin & integer_of(width) & 1);
      return std::string(static_cast<std::size_t>(left), ' ') + text +
             std::string(static_cast<std::size_t>(margin - left), ' ');
    }
    where.error(fmt::format("the filter '{}' is not supported", name));
  }

  template <class Key>
  void sort_values(value_list& items, bool reverse, Key key, const site& where) {
    std::vector<std::pair<value, value>> keyed;
    keyed.reserve(items.size());
    for (value& v : items) {
      value k = key(v);
      keyed.emplace_back(std::move(k), std::move(v));
    }
    // Python's sort is stable, and stays so reversed: equal keys keep their order either way.
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
      return reverse ? less(b.first, a.first, where) : less(a.first, b.first, where);
    });
    items.clear();
    for (auto& [k, v] : keyed) items.push_back(std::move(v));
  }

  value map(const value& subject, const arguments& given, const site& where) {
    value_list mapped;
    const auto attribute_keyword = std::find_if(given.keywords.begin(), given.keywords.end(),
                                                [](const auto& keyword) { return keyword.first == "attribute"; });
    if (attribute_keyword != given.keywords.end()) {
      std::optional<value> fallback;
      for (const auto& [name, v] : given.keywords) {
        if (name == "default") {
          fallback = v;
        } else if (name != "attribute") {
          where.error(fmt::format("map(attribute=...) takes no argument '{}'", name));
        }
      }
      if (!given.positional.empty()) where.error("map(attribute=...) takes no positional argument");
      for (const value& v : iterate(subject, where)) {
        value found = attribute_path(v, attribute_keyword->second, where);
        if (found.is<undefined_value>() && fallback) found = *fallback;
        mapped.push_back(std::move(found));
      }
    } else {
      if (given.positional.empty() || !given.positional.front().is<std::string>()) {
        where.error("map takes a filter's name or attribute=");
      }
      const std::string& filter_name = given.positional.front().as<std::string>();
      if (!among(supported_filters(), filter_name))
        where.error(fmt::format("the filter '{}' is not supported", filter_name));
      arguments rest;
      rest.positional.assign(given.positional.begin() + 1, given.positional.end());
      rest.keywords = given.keywords;
      for (const value& v : iterate(subject, where)) mapped.push_back(filter(filter_name, v, rest, where));
    }
    return make_list(std::move(mapped), sequence_kind::generator);
  }

  value tojson(const value& subject, const arguments& given, const std::string& callee, const site& where) {
    // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
    const bound_arguments bound(given, callee, {"ensure_ascii", "indent", "separators", "sort_keys"}, where);
    json_style style;
    style.ensure_ascii = truthy(bound.get(0, false));
    const value indent = bound.get(1, none_value{});
    if (indent.is<std::string>()) {
      style.indent = indent.as<std::string>();
    } else if (is_integer(indent)) {
      style.indent = std::string(static_cast<std::size_t>(std::max<std::int64_t>(0, integer_of(indent))), ' ');
    } else if (!indent.is<none_value>()) {
      where.error("tojson's indent must be an integer, a string or None");
    }
    if (style.indent) style.item_separator = ",";
    const value separators = bound.get(2, none_value{});
    if (!separators.is<none_value>()) {
      if (!is_indexable(separators) || items_of(separators).size() != 2 || !items_of(separators)[0].is<std::string>() ||
          !items_of(separators)[1].is<std::string>()) {
        where.error("tojson's separators must be two strings");
      }
      style.item_separator = items_of(separators)[0].as<std::string>();
      style.key_separator = items_of(separators)[1].as<std::string>();
    }
    style.sort_keys = truthy(bound.get(3, false));
    std::string out;
    dump_json(subject, style, 0, out, where);
    return out;
  }

  value indent(const value& subject, const arguments& given, const std::string& callee, const site& where) {
    const bound_arguments bound(given, callee, {"width", "first", "blank"}, where);
    if (!subject.is<std::string>()) {
      if (subject.is<undefined_value>()) where.error(subject.as<undefined_value>().why);
      where.error(fmt::format("indent takes a string, not '{}'", type_name(subject)));
    }
    const value width = bound.get(0, std::int64_t{4});
    std::string indention;
    if (width.is<std::string>()) {
      indention = width.as<std::string>();
    } else if (is_integer(width)) {
      indention = std::string(static_cast<std::size_t>(std::max<std::int64_t>(0, integer_of(width))), ' ');
    } else {
      where.error("indent's width must be an integer or a string");
    }
    const std::vector<std::string> lines = python_splitlines(subject.as<std::string>() + "\n");
    std::string out;
    if (truthy(bound.get(2, false))) {
      for (std::size_t k = 0; k < lines.size(); ++k) out.append(k == 0 ? "" : "\n" + indention).append(lines[k]);
    } else {
      out = lines.front();
      for (std::size_t k = 1; k < lines.size(); ++k)
        out.append("\n").append(lines[k].empty() ? "" : indention).append(lines[k]);
    }
    if (truthy(bound.get(1, false))) out = indention + out;
    return out;
  }

  const program& tree_;
  frame root_;
  std::string* output_ = nullptr;
  std::vector<std::pair<std::size_t, std::size_t>> generation_;
  int macro_depth_ = 0;
};

}  // namespace

std::string_view python_rstrip(std::string_view text) {
  std::size_t end = text.size();
  while (end > 0) {
    std::size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    if (!python_space(detail::code_point_at(text, start).first)) break;
    end = start;
  }
  return text.substr(0, end);
}

const value* dict_entries::find(std::string_view key) const {
  for (const auto& [name, v] : items) {
    if (name == key) return &v;
  }
  return nullptr;
}

void dict_entries::assign(std::string key, value item) {
  for (auto& [name, v] : items) {
    if (name == key) {
      v = std::move(item);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(item));
}

value make_list(value_list items, sequence_kind kind) {
  return sequence_value{std::make_shared<const value_list>(std::move(items)), kind};
}

value make_dict(dict_entries entries) { return dict_value{std::make_shared<const dict_entries>(std::move(entries))}; }

namespace {

// Python's strings are Unicode: a string that is not valid UTF-8 has no value to give the template.
const std::string& checked_text(const std::string& text) {
  if (const auto bad = detail::invalid_utf8_at(text)) {
    throw_error<chat_template_error>("a string of the input is not valid UTF-8 (byte {} of {})", *bad,
                                     python_repr(std::string_view(detail::lossy_utf8(text))));
  }
  return text;
}

}  // namespace

value from_json(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null: return none_value{};
    case nlohmann::ordered_json::value_t::boolean: return json.get<bool>();
    case nlohmann::ordered_json::value_t::number_integer: return json.get<std::int64_t>();
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto number = json.get<std::uint64_t>();
      if (number > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        throw_error<chat_template_error>("the integer {} in the input does not fit in 64 bits", number);
      }
      return static_cast<std::int64_t>(number);
    }
    case nlohmann::ordered_json::value_t::number_float: return json.get<double>();
    case nlohmann::ordered_json::value_t::string: return checked_text(json.get_ref<const std::string&>());
    case nlohmann::ordered_json::value_t::array: {
      value_list items;
      items.reserve(json.size());
      for (const auto& element : json) items.push_back(from_json(element));
      return make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      dict_entries entries;
      entries.items.reserve(json.size());
      for (const auto& [key, element] : json.items()) entries.items.emplace_back(checked_text(key), from_json(element));
      return make_dict(std::move(entries));
    }
    default: throw_error<chat_template_error>("the input holds binary data, which has no Python value");
  }
}

rendering render(const program& tree, const std::vector<std::pair<std::string, value>>& names) {
  return renderer(tree, names).run();
}

const std::vector<std::string_view>& supported_filters() {
  static const std::vector<std::string_view> names = {
      "abs",   "capitalize", "center", "count",      "d",       "default", "dictsort", "e",      "escape",
      "first", "float",      "indent", "int",        "items",   "join",    "last",     "length", "list",
      "lower", "map",        "reject", "rejectattr", "replace", "reverse", "safe",     "select", "selectattr",
      "sort",  "string",     "title",  "tojson",     "trim",    "unique",  "upper"};
  return names;
}

const std::vector<std::string_view>& supported_tests() {
  static const std::vector<std::string_view> names = {
      "boolean",  "callable", "defined",  "divisibleby", "eq",      "equalto", "even",
      "false",    "float",    "ge",       "greaterthan", "gt",      "in",      "integer",
      "iterable", "le",       "lessthan", "lt",          "mapping", "ne",      "none",
      "number",   "odd",      "sameas",   "sequence",    "string",  "true",    "undefined"};
  return names;
}

const std::vector<std::string_view>& supported_methods() {
  static const std::vector<std::string_view> names = {
      "capitalize", "count",      "cycle",      "endswith", "find",    "format", "get",    "items",
      "join",       "keys",       "lower",      "lstrip",   "replace", "rfind",  "rsplit", "rstrip",
      "split",      "splitlines", "startswith", "strip",    "title",   "upper",  "values"};
  return names;
}

const std::vector<std::string_view>& supported_functions() {
  static const std::vector<std::string_view> names = {"dict", "namespace", "raise_exception", "range", "strftime_now"};
  return names;
}

}  // namespace loom::data::jinja
