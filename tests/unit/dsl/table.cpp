// The rule table (include/loom/dsl/rule_table.hpp): its rows are well formed, and docs/rules.md lists
// exactly those rows.
#include <loom/dsl.hpp>

#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct row {
  std::string_view id;
  loom::violation code;
  std::string_view sentence;
};

#define LOOM_TEST_ROW(id, sentence) row{#id, loom::violation::id, sentence},
constexpr row table[] = {LOOM_RULES(LOOM_TEST_ROW)};
#undef LOOM_TEST_ROW

// How docs/rules.md writes a row: | `id` | `sentence` |, a | escaped as a Markdown table needs.
std::string doc_line(const row& r) {
  std::string line = "| `" + std::string(r.id) + "` | `";
  for (char c : r.sentence) {
    if (c == '|') line += '\\';
    line += c;
  }
  return line + "` |";
}

// "<before><n><after>" for rule n, e.g. "### R5 ".
std::string with_rule(std::string_view before, int n, std::string_view after) {
  return std::string(before).append(std::to_string(n)).append(after);
}

std::vector<std::string> lines_of_rules_md() {
  std::ifstream file(LOOM_DOCS_DIR "/rules.md");
  REQUIRE(file.is_open());
  std::vector<std::string> lines;
  for (std::string line; std::getline(file, line);) lines.push_back(line);
  return lines;
}

}  // namespace

TEST_CASE("every row of the rule table is well formed", "[dsl][table]") {
  for (const row& r : table) {
    INFO(r.id);
    const int id = loom::rule_of(r.code);
    CHECK(loom::sentence(r.code) == r.sentence);
    CHECK(id > 0);
    CHECK(r.id.starts_with(with_rule("r", id, "_")));
    CHECK(r.sentence.starts_with(with_rule("loom R", id, ": ")));
    CHECK(r.sentence.find(": ", r.sentence.find(": ") + 2) != std::string_view::npos);    // what is wrong: the fix
    CHECK(std::ranges::all_of(r.sentence, [](char c) { return c >= ' ' && c <= '~'; }));  // printable ASCII
  }
}

TEST_CASE("docs/rules.md lists the rule table, row for row", "[dsl][table]") {
  const std::vector<std::string> doc = lines_of_rules_md();
  const auto in_doc = [&](std::string_view line) { return std::ranges::find(doc, line) != doc.end(); };

  std::set<std::string> rows, headings;
  for (const row& r : table) {
    INFO(r.id);
    CHECK(in_doc(doc_line(r)));
    rows.insert(doc_line(r));
    headings.insert(with_rule("### R", loom::rule_of(r.code), " "));
  }
  // And nothing the table lacks: no stale row, no section for a rule without sentences.
  for (const std::string& line : doc) {
    INFO(line);
    if (line.starts_with("| `r")) CHECK(rows.contains(line));
    if (line.starts_with("### R")) CHECK(headings.contains(line.substr(0, line.find(' ', 4) + 1)));
  }
  for (const std::string& heading : headings) {
    INFO(heading);
    CHECK(std::ranges::any_of(doc, [&](const std::string& line) { return line.starts_with(heading); }));
  }
}
