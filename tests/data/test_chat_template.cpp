// loom::data::chat_template on small templates with their output written by hand: every construct of
// the Jinja subset, the inputs a render gets, from_pretrained, and each refusal's sentence (the real
// templates are checked against transformers by chat_template_vs_jinja.py).
#include <loom/data/chat_template.hpp>

#include "scratch_folder.hpp"

#include <nlohmann/json.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <fstream>
#include <string>
#include <utility>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::MessageMatches;
using loom::data::chat_render_options;
using loom::data::chat_template;
using loom::data::chat_template_error;
using nlohmann::ordered_json;

namespace {

ordered_json conversation() {
  return ordered_json::parse(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                                 {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}])");
}

std::string render(const std::string& source, const ordered_json& variables = ordered_json::object(),
                   const ordered_json& messages = conversation()) {
  chat_render_options options;
  options.variables = variables;
  return chat_template::from_text(source).render(messages, options).text;
}

// The message of the error that reading (or rendering) `source` raises.
std::string error_of(const std::string& source, const ordered_json& variables = ordered_json::object()) {
  try {
    (void)render(source, variables);
  } catch (const chat_template_error& error) {
    return error.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("text, output and comments") {
  CHECK(render("Hello {{ 'world' }}{# not printed #}!") == "Hello world!");
  CHECK(render("a\n") == "a");      // jinja2 drops one trailing newline
  CHECK(render("a\n\n") == "a\n");  // and one only
  CHECK(render("a\r\nb\rc") == "a\nb\nc");
  CHECK(render("{{ messages | length }} {{ messages[1].content }}") == "4 Hi");
  CHECK(render("{{ 1, 'a' }}") == "(1, 'a')");
}

TEST_CASE("whitespace control: '-', trim_blocks, lstrip_blocks, '+'") {
  CHECK(render("a  {{- 'b' -}}  \n c") == "abc");
  CHECK(render("a \n {%- if true -%} \n b {%- endif %}") == "ab");
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the spaces before it on its line
  CHECK(render("{% if true %}\n    x\n    {% endif %}\ny") == "    x\ny");
  CHECK(render("  {# comment #}\nz") == "z");
  // variables keep their line's indentation, and the newline after them
  CHECK(render("  {{ 'v' }}\nw") == "  v\nw");
  // '+' keeps what trim_blocks and lstrip_blocks would take
  CHECK(render("  {%+ if true +%}\nx{% endif %}") == "  \nx");
  // lstrip only at a line's start: text before the tag on its line stays
  CHECK(render("a  {% if true %}b{% endif %}") == "a  b");
  CHECK(render("\u3000{%- if true %}b{% endif %}") == "b");  // Python's whitespace, U+3000 included
}

TEST_CASE("values print as Python prints them") {
  CHECK(render("{{ [1, 'a', none, true, false, 1.0, [], {}] }}") == "[1, 'a', None, True, False, 1.0, [], {}]");
  CHECK(render("{{ {'k': (1,), \"q\": (1, 2), 'e': ()} }}") == "{'k': (1,), 'q': (1, 2), 'e': ()}");
  CHECK(render("{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 1.5e-5 }} {{ 0.0001 }} {{ -0.0 }} {{ 2.5e300 * 1e10 "
               "}}") == "1.0 0.30000000000000004 1e+16 1000000000000000.0 1.5e-05 0.0001 -0.0 inf");
  CHECK(render("{{ ['it\\'s', 'say \"hi\"', 'both \\' \"', 'tab\\t', '\\x01', 'é😀', '\\u200b'] }}") ==
        "[\"it's\", 'say \"hi\"', 'both \\' \"', 'tab\\t', '\\x01', 'é😀', '\\u200b']");
  CHECK(render("{{ none }} {{ None }} {{ True }} {{ false }}") == "None None True False");
  CHECK(render("{{ 'a\\nb' }}|{{ '\\101\\x42\\u0043\\U0001F600' }}|{{ '\\q' }}|{{ 'x' 'y' }}") == "a\nb|ABC😀|\\q|xy");
  CHECK(render("{{ {'a': 1}.items() }} {{ {'a': 1}.keys() }}") == "dict_items([('a', 1)]) dict_keys(['a'])");
  CHECK(render("{% set ns = namespace(a=1) %}{{ ns }}") == "<Namespace {'a': 1}>");
}

TEST_CASE("arithmetic follows Python") {
  CHECK(render("{{ 7 + 3 }} {{ 7 - 10 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 8 / 2 }}") == "10 -3 21 3.5 4.0");
  CHECK(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}") ==
        "3 -4 1 2 3.0 0.5");
  CHECK(render("{{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 1 + true }}") == "1024 0.5 64 4 2");
  CHECK(render("{{ 'ab' + 'cd' }} {{ 'ab' * 2 }} {{ [1] + [2] }} {{ [0] * 3 }}") == "abcd abab [1, 2] [0, 0, 0]");
  CHECK(render("{{ 'n' ~ 1 ~ 2.0 ~ none ~ true ~ nothing }}") == "n12.0NoneTrue");
  CHECK(render("{{ '%s is %d%%' % ('x', 3) }}") == "x is 3%");
  CHECK(render("{{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }} {{ 10 - 2 - 3 }} {{ 2 ~ 3 * 4 }}") == "14 20 5 212");
  CHECK_THAT(error_of("\n{{ 1 / 0 }}"), ContainsSubstring("chat_template line 2: division by zero"));
  CHECK_THAT(error_of("{{ 'a' + 1 }}"), ContainsSubstring("unsupported operand type(s) for +: 'str' and 'int'"));
  CHECK_THAT(error_of("{{ 9223372036854775807 + 1 }}"), ContainsSubstring("overflows 64 bits"));
}

TEST_CASE("comparisons, logic and the inline if") {
  CHECK(render("{{ 1 == 1.0 }} {{ 1 != 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }}") ==
        "True True True True True False");
  CHECK(
      render(
          "{{ 'ell' in 'hello' }} {{ 2 in [1, 2] }} {{ 'a' in {'a': 1} }} {{ 'z' not in 'abc' }} {{ 'x' in nope }}") ==
      "True True True True False");
  CHECK(render("{{ true and 'x' }} {{ 0 or 'y' }} {{ not [] }} {{ '' or [] }} {{ none or 0 }}") == "x y True [] 0");
  CHECK(render("{{ 'a' if true else 'b' }} {{ 'a' if false else 'b' }}|{{ 'a' if false }}|") == "a b||");
  CHECK_THAT(error_of("{{ [1] < 'a' }}"),
             ContainsSubstring("'<' is not supported between instances of 'list' and 'str'"));
}

TEST_CASE("undefined names behave as jinja2's Undefined") {
  CHECK(render("[{{ nope }}] {{ nope is defined }} {{ nope is undefined }} {{ not nope }} {{ nope | length }}") ==
        "[] False True True 0");
  CHECK(render("{{ nope | default('d') }} {{ '' | default('e', true) }} {{ nope | list }} {{ nope is iterable }}") ==
        "d e [] True");
  CHECK(render("{% for x in nope %}never{% endfor %}{{ messages[0].missing }}|{{ none.attr }}|{{ 'a'.attr }}") == "||");
  CHECK(render("{{ messages[0].missing is defined }} {{ messages[99] is defined }}") == "False False");
  // an attribute of an undefined value is an error, as in jinja2, naming what was undefined
  CHECK_THAT(error_of("\n\n{{ nope.attr }}"), ContainsSubstring("chat_template line 3: 'nope' is undefined"));
  CHECK_THAT(error_of("{{ messages[0].missing.x }}"), ContainsSubstring("'dict object' has no attribute 'missing'"));
  CHECK_THAT(error_of("{{ nope + 1 }}"), ContainsSubstring("'nope' is undefined"));
}

TEST_CASE("for loops: loop.*, else, filters, unpacking, break and continue") {
  CHECK(render("{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
               "{{ loop.first }}{{ loop.last }}{{ loop.length }} {% endfor %}") ==
        "1043TrueFalse4 2132FalseFalse4 3221FalseFalse4 4310FalseTrue4 ");
  CHECK(render("{% for x in 'abc' %}{{ loop.previtem | default('-') }}{{ x }}{{ loop.nextitem | default('-') }}"
               "{{ loop.cycle(1, 2) }} {% endfor %}") == "-ab1 abc2 bc-1 ");
  CHECK(render("{% for x in [] %}x{% else %}empty{% endfor %}") == "empty");
  CHECK(render("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}/{{ loop.length }} {% else %}none{% endfor %}") ==
        "2/2 4/2 ");
  CHECK(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}{{ v }}{% endfor %} "
               "{% for k in {'z': 1, 'y': 2} %}{{ k }}{% endfor %} {% for a, b in [[1, 2], 'xy'] %}{{ a }}{{ b }}{% "
               "endfor %}") == "a1b2 zy 12xy");
  CHECK(render("{% for i in range(10) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}{% endif %}"
               "{{ i }}{% endfor %}") == "023");
  CHECK(render("{% for r in [[1, 2], [3]] %}{% for c in r %}{{ loop.index }}{{ c }}{% endfor %};{% endfor %}") ==
        "1122;13;");
  CHECK(render("{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(3, 0, -1) | list }}") ==
        "[0, 1, 2] [1, 3, 5] [3, 2, 1]");
  // each iteration is a scope of its own: what it sets is gone after it (namespace carries values out)
  CHECK(render("{% set x = 0 %}{% for i in [1, 2] %}[{{ x }}]{% set x = i %}{% endfor %}{{ x }}") == "[0][0]0");
  CHECK(
      render("{% set ns = namespace(n=0) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}") ==
      "6");
  CHECK_THAT(error_of("{% for a, b in [[1, 2, 3]] %}{% endfor %}"), ContainsSubstring("too many values to unpack"));
  CHECK_THAT(error_of("{% for a in 5 %}{% endfor %}"), ContainsSubstring("'int' object is not iterable"));
}

TEST_CASE("if, elif, else and set") {
  CHECK(render("{% if messages | length > 9 %}a{% elif messages | length > 3 %}b{% else %}c{% endif %}") == "b");
  CHECK(render("{% if false %}a{% else %}c{% endif %}{% if false %}never{% endif %}") == "c");
  CHECK(render("{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}") == "2");  // if is no scope
  CHECK(render("{% set a, b = 1, 'two' %}{{ a }}{{ b }}") == "1two");
  CHECK(render("{% set block %}x{{ 1 + 1 }}y{% endset %}[{{ block }}] {{ block | length }}") == "[x2y] 3");
  CHECK(render("{% set messages = messages[1:] %}{{ messages[0].role }}") == "user");
  CHECK_THAT(error_of("{% set x = 1 %}{% set x.a = 2 %}"), ContainsSubstring("'x' is no namespace"));
}

TEST_CASE("macros") {
  const std::string macros =
      "{% macro tag(name, body='', close=true) %}<{{ name }}>{{ body }}{% if close %}</{{ name }}>"
      "{% endif %}{% endmacro %}";
  CHECK(
      render(macros + "{{ tag('b') }} {{ tag('i', 'x') }} {{ tag('p', close=false) }} {{ tag(body='y', name='u') }}") ==
      "<b></b> <i>x</i> <p> <u>y</u>");
  CHECK(render("{% macro m(a, b=a ~ '!') %}{{ a }}{{ b }}{% endmacro %}{{ m('x') }} {{ m }}") == "xx! <Macro 'm'>");
  CHECK(render("{% macro down(n) %}{{ n }}{% if n > 0 %}{{ down(n - 1) }}{% endif %}{% endmacro %}{{ down(3) }}") ==
        "3210");
  CHECK(render("{% macro m() %}{% set inner = 1 %}{{ inner }}{% endmacro %}{{ m() }}[{{ inner }}]") == "1[]");
  CHECK(render("{% macro m(a) %}[{{ a }}]{% endmacro %}{{ m() }}") == "[]");  // a missing argument is undefined
  CHECK_THAT(error_of("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}"),
             ContainsSubstring("macro 'm' takes not more than 1 argument"));
  CHECK_THAT(error_of("{% macro m(a) %}{% endmacro %}{{ m(b=1) }}"),
             ContainsSubstring("takes no keyword argument 'b'"));
}

TEST_CASE("tests") {
  CHECK(render("{{ 'x' is string }} {{ 1 is number }} {{ true is number }} {{ 1 is integer }} {{ true is integer }} "
               "{{ 1.0 is float }} {{ none is none }} {{ true is boolean }} {{ true is true }} {{ 1 is true }} "
               "{{ false is false }}") == "True True True True False True True True True False True");
  CHECK(render("{{ {} is mapping }} {{ [] is mapping }} {{ 'a' is iterable }} {{ 5 is iterable }} {{ [] is sequence }} "
               "{{ 'a' is sequence }} {{ 5 is sequence }}") == "True False True False True True False");
  CHECK(render(
            "{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 2 is in [1, 2] }}") ==
        "True True True False True");
  CHECK(render("{{ 1 is eq 1 }} {{ 'a' is equalto 'b' }} {{ 1 is ne 2 }} {{ 1 is lt 2 }} {{ 1 is lessthan 0 }} {{ 2 is "
               "gt 1 }} "
               "{{ 2 is greaterthan 3 }} {{ 2 is ge 2 }} {{ 3 is le 2 }} {{ none is sameas none }}") ==
        "True False True True False True False True False True");
  CHECK(render("{{ 4 is not odd }} {{ 'x' is not string }} {{ nope is not defined }}") == "True False True");
  CHECK(render("{% macro m() %}{% endmacro %}{{ m is callable }} {{ 'a' is callable }}") == "True False");
}

TEST_CASE("filters") {
  CHECK(render("[{{ '  x \\n' | trim }}] [{{ 'xxhixx' | trim('x') }}] [{{ '\u3000y\u00a0' | trim }}]") ==
        "[x] [hi] [y]");
  CHECK(render("{{ 'AbC' | lower }} {{ 'AbC' | upper }} {{ 'hELLO wORLD' | capitalize }} {{ 'one-two (three [four' | "
               "title }}") == "abc ABC Hello world One-Two (Three [Four");
  CHECK(render("{{ 'éa' | upper }} {{ 'ÀÉ' | lower }}") == "ÉA àé");
  CHECK(
      render("{{ 'aaa' | replace('a', 'b', 2) }} {{ 'ab' | replace('', '-') }} {{ 42 | string }} {{ [1] | string }}") ==
      "bba -a-b- 42 [1]");
  CHECK(render("{{ '<a href=\"x\">&\\'</a>' | e }} {{ '<b>' | escape }} {{ '<i>' | safe }}") ==
        "&lt;a href=&#34;x&#34;&gt;&amp;&#39;&lt;/a&gt; &lt;b&gt; <i>");
  CHECK(render("{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ '0x1A' | int(0, 16) }} {{ 3.9 "
               "| int }} "
               "{{ '3.25' | float }} {{ 'x' | float }} {{ 2 | float }} {{ -3 | abs }} {{ -2.5 | abs }}") ==
        "42 4 0 7 26 3 3.25 0.0 2.0 3 2.5");
  CHECK(render("{{ 'héllo' | length }} {{ [1, 2] | count }} {{ {'a': 1} | length }} {{ [3, 4] | first }} {{ [3, 4] | "
               "last }} "
               "{{ 'xyz' | first }} [{{ [] | first }}]") == "5 2 1 3 4 x []");
  CHECK(render("{{ ['a', 'b'] | join(', ') }} {{ [1, 2] | join }} {{ messages | join('/', attribute='role') }}") ==
        "a, b 12 system/user/assistant/user");
  CHECK(render("{{ 'abc' | list }} {{ {'k': 1} | list }} {{ [1, 2] | reverse | list }} {{ 'abc' | reverse }}") ==
        "['a', 'b', 'c'] ['k'] [2, 1] cba");
  CHECK(render("{{ [3, 1, 2] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ ['b', 'A', 'a'] | sort }} "
               "{{ ['b', 'A', 'a'] | sort(case_sensitive=true) }} {{ ['b', 'A', 'a', 'B'] | unique | list }}") ==
        "[1, 2, 3] [3, 2, 1] ['A', 'a', 'b'] ['A', 'a', 'b'] ['b', 'A']");
  CHECK(render("{{ {'b': 1, 'a': 2} | dictsort }} {{ {'b': 1, 'a': 2} | dictsort(by='value', reverse=true) }} "
               "{{ {'x': 1} | items | list }}") == "[('a', 2), ('b', 1)] [('a', 2), ('b', 1)] [('x', 1)]");
  CHECK(render("{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }} "
               "{{ messages | rejectattr('role', 'eq', 'user') | map(attribute='role') | list }} "
               "{{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3] | reject('gt', 1) | list }} {{ [0, 1, ''] | "
               "select | list }}") == "Hi,Bye ['system', 'assistant'] [1, 3] [1] [1]");
  CHECK(render("{{ ['a', 'b'] | map('upper') | list }} {{ messages | map(attribute='name', default='?') | list }}") ==
        "['A', 'B'] ['?', '?', '?', '?']");
  CHECK(render("{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent('> ', blank=true) "
               "}}") == "a\n    b\n\n    c|  a\n  b|a\n> \n> b");
  CHECK(render("[{{ 'x' | center(5) }}] [{{ 'ab' | center(5) }}] [{{ 'abc' | center(2) }}]") ==
        "[  x  ] [  ab ] [abc]");
  // a generator (select, map, reverse, ...) is true even when empty, as in Python
  CHECK(render("{% if [1] | select('even') %}true{% endif %} {{ [1] | select('even') | list | length }}") == "true 0");
}

TEST_CASE("tojson writes what Python's json.dumps writes") {
  const ordered_json variables = ordered_json::parse(R"({"v": {"b": [1, 2.5, null, true, "é\"\n"], "a": {}}})");
  CHECK(render("{{ v | tojson }}", variables) == R"({"b": [1, 2.5, null, true, "é\"\n"], "a": {}})");
  CHECK(render("{{ v | tojson(indent=2) }}", variables) ==
        "{\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true,\n    \"é\\\"\\n\"\n  ],\n  \"a\": {}\n}");
  CHECK(render("{{ v | tojson(sort_keys=true, separators=(',', ':')) }}", variables) ==
        R"({"a":{},"b":[1,2.5,null,true,"é\"\n"]})");
  CHECK(render("{{ 'é😀\\x01' | tojson(ensure_ascii=true) }} {{ 1e16 | tojson }} {{ (1, 2) | tojson }}") ==
        R"("\u00e9\ud83d\ude00\u0001" 1e+16 [1, 2])");
  CHECK_THAT(error_of("{{ nope | tojson }}"), ContainsSubstring("Object of type Undefined is not JSON serializable"));
}

TEST_CASE("string and dict methods, slicing") {
  CHECK(render("[{{ '  a b  '.strip() }}] [{{ 'xxaxx'.lstrip('x') }}] [{{ 'xxaxx'.rstrip('x') }}]") ==
        "[a b] [axx] [xxa]");
  CHECK(render("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(none, 1) }} {{ 'a b c'.rsplit(' ', "
               "1) }}") == "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c'] ['a b', 'c']");
  CHECK(render("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'hello world'.title() }} "
               "{{ 'hELLO'.capitalize() }} {{ 'aXbX'.replace('X', '-') }} {{ 'aXbX'.replace('X', '-', 1) }}") ==
        "True True Hello World Hello a-b- a-bX");
  CHECK(render("{{ 'héllo'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.find('z') }} {{ 'banana'.count('an') }} "
               "{{ 'AB'.lower() }} {{ 'ab'.upper() }}") == "2 3 -1 2 ab AB");
  CHECK(render("{{ '{} and {}'.format('a', 1) }} {{ '{1}{0}{n}'.format('x', 'y', n='z') }} {{ '-'.join(['a', 'b']) }} "
               "{{ 'a\\nb\\r\\nc'.splitlines() }}") == "a and 1 yxz a-b ['a', 'b', 'c']");
  CHECK(render("{{ messages[0].get('role') }} {{ messages[0].get('nope') }} {{ messages[0].get('nope', 0) }} "
               "{{ messages[0].keys() | list }} {{ messages[0].values() | list }}") ==
        "system None 0 ['role', 'content'] ['system', 'Be brief.']");
  CHECK(
      render(
          "{{ [1, 2, 3, 4][1:3] }} {{ [1, 2, 3][::-1] }} {{ [1, 2, 3][-1] }} {{ [1, 2, 3][-2:] }} {{ [1, 2, 3][:-1] }} "
          "{{ [1, 2, 3, 4, 5][4:0:-2] }} {{ (1, 2, 3)[1:] }} [{{ [1][5] }}]") ==
      "[2, 3] [3, 2, 1] 3 [2, 3] [1, 2] [5, 3] (2, 3) []");
  CHECK(render("{{ 'héllo'[1:3] }} {{ 'héllo'[::-1] }} {{ 'héllo'[1] }} {{ 'héllo'[-2:] }} {{ "
               "messages[-1]['content'][:2] }}") == "él olléh é lo By");
}

TEST_CASE("raise_exception and strftime_now") {
  CHECK_THAT(
      error_of("{% if true %}\n{{ raise_exception('Roles must alternate: user, assistant, ... é') }}{% endif %}"),
      ContainsSubstring("chat_template line 2: the template raised an exception: Roles must alternate: user, "
                        "assistant, ... é"));
  CHECK(render("{{ strftime_now('%Y') | length }} {{ strftime_now('%Y-%m-%d')[4] }}") == "4 -");
}

TEST_CASE("generation blocks give the byte ranges of what they write") {
  const chat_template chat = chat_template::from_text(
      "{% for m in messages %}{{ m.role }}: {% if m.role == 'assistant' %}{% generation %}{{ m.content }}!"
      "{% endgeneration %}{% else %}{{ m.content }}{% endif %}{{ '\\n' }}{% endfor %}");
  CHECK(chat.has_generation_blocks());
  const auto messages =
      ordered_json::parse(R"([{"role": "user", "content": "é"}, {"role": "assistant", "content": "你好"},
                                               {"role": "user", "content": "x"}, {"role": "assistant", "content": ""}])");
  const loom::data::rendered_chat rendered = chat.render(messages);
  CHECK(rendered.text == "user: é\nassistant: 你好!\nuser: x\nassistant: !\n");
  using span = std::pair<std::size_t, std::size_t>;
  REQUIRE(rendered.generation == std::vector<span>{{20, 27}, {47, 48}});
  CHECK(rendered.text.substr(20, 7) == "你好!");
  CHECK_FALSE(chat_template::from_text("{{ messages }}").has_generation_blocks());
  CHECK(chat_template::from_text("{{ 1 }}").render(messages).generation.empty());
}

TEST_CASE(
    "what a render gets: tools, documents, add_generation_prompt, variables, the messages as transformers passes "
    "them") {
  const chat_template probe = chat_template::from_text(
      "{{ tools is defined }} {{ tools is none }} {{ documents is none }} {{ add_generation_prompt }} {{ bos_token }}");
  CHECK(probe.render(conversation()).text == "True True True False ");
  chat_render_options options;
  options.add_generation_prompt = true;
  options.tools = ordered_json::parse(R"([{"name": "f"}])");
  options.documents = ordered_json::parse(R"([{"text": "d"}])");
  options.variables = {{"bos_token", "<s>"}};
  CHECK(probe.render(conversation(), options).text == "True False False True <s>");

  // null fields dropped; reasoning offered as `thinking` (first) and `reasoning_content`
  const chat_template printer = chat_template::from_text("{% for m in messages %}{{ m }}\n{% endfor %}");
  const auto messages = ordered_json::parse(R"([{"role": "user", "content": "q", "name": null},
      {"role": "assistant", "content": "a", "reasoning": "r"},
      {"role": "assistant", "thinking": "t", "content": "b", "reasoning_content": "rc"}])");
  CHECK(printer.render(messages).text ==
        "{'role': 'user', 'content': 'q'}\n"
        "{'thinking': 'r', 'role': 'assistant', 'content': 'a', 'reasoning': 'r', 'reasoning_content': 'r'}\n"
        "{'thinking': 't', 'role': 'assistant', 'content': 'b', 'reasoning_content': 'rc'}\n");

  CHECK_THROWS_MATCHES(printer.render(ordered_json::array()), chat_template_error,
                       MessageMatches(ContainsSubstring("the conversation is empty")));
  CHECK_THROWS_MATCHES(printer.render(ordered_json::parse(R"(["hi"])")), chat_template_error,
                       MessageMatches(ContainsSubstring("message 0 is a JSON string, not an object")));
  CHECK_THROWS_MATCHES(printer.render(ordered_json::array({{{"role", "user"}, {"content", "\xe4\xbd"}}})),
                       chat_template_error,
                       MessageMatches(ContainsSubstring("a string of the input is not valid UTF-8 (byte 0")));
  chat_render_options reserved;
  reserved.variables = {{"messages", 1}};
  CHECK_THROWS_MATCHES(printer.render(conversation(), reserved), chat_template_error,
                       MessageMatches(ContainsSubstring("'messages' is given by the render's own argument")));
}

TEST_CASE("from_pretrained reads tokenizer_config.json or chat_template.jinja, and the special tokens") {
  const loom::testing::scratch_folder folder;
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(folder.path() / name, std::ios::binary) << text;
  };
  CHECK_THROWS_MATCHES(chat_template::from_pretrained(folder.path()), chat_template_error,
                       MessageMatches(ContainsSubstring("has no chat template")));

  write("tokenizer_config.json", R"({"chat_template": "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ unk_token }}",
      "bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": false}, "pad_token": null})");
  CHECK(chat_template::from_pretrained(folder.path()).render(conversation()).text == "<s>|</s>||");
  chat_render_options options;
  options.variables = {{"eos_token", "<|end|>"}};  // a render's variables come before the special tokens
  CHECK(chat_template::from_pretrained(folder.path()).render(conversation(), options).text == "<s>|<|end|>||");

  write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "tools"},
                                                       {"name": "default", "template": "default {{ bos_token }}"}]})");
  CHECK(chat_template::from_pretrained(folder.path()).render(conversation()).text == "default ");
  write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "tools"}]})");
  CHECK_THROWS_MATCHES(chat_template::from_pretrained(folder.path()), chat_template_error,
                       MessageMatches(ContainsSubstring("none named 'default' (it has tool_use)")));

  // chat_template.jinja beside the config takes priority, as in transformers
  write("chat_template.jinja", "from the file {{ bos_token }}\n");
  write("tokenizer_config.json", R"({"chat_template": "from the config", "bos_token": "<bos>"})");
  CHECK(chat_template::from_pretrained(folder.path()).render(conversation()).text == "from the file <bos>");
}

TEST_CASE("constructs outside the subset are refused when the template is read, naming them and their line") {
  const auto refusal = [](const std::string& source) {
    try {
      (void)chat_template::from_text(source);
    } catch (const chat_template_error& error) {
      return std::string(error.what());
    }
    return std::string("(not refused)");
  };
  CHECK_THAT(
      refusal("a\n\n{{ text | wordwrap(10) }}"),
      ContainsSubstring("loom: chat_template line 3: the filter 'wordwrap' is not supported; loom supports: abs,"));
  CHECK_THAT(refusal("{% if x is lower %}{% endif %}"), ContainsSubstring("line 1: the test 'lower' is not supported"));
  CHECK_THAT(refusal("\n{% include 'other.jinja' %}"),
             ContainsSubstring("line 2: the tag 'include' is not supported; loom supports: for, if, set, macro"));
  CHECK_THAT(refusal("{% raw %}{{ x }}{% endraw %}"), ContainsSubstring("the tag 'raw' is not supported"));
  CHECK_THAT(refusal("{% call m() %}x{% endcall %}"), ContainsSubstring("the tag 'call' is not supported"));
  CHECK_THAT(refusal("{% filter upper %}x{% endfilter %}"), ContainsSubstring("the tag 'filter' is not supported"));
  CHECK_THAT(refusal("{% set l = [] %}\n{{ l.append(1) }}"),
             ContainsSubstring("line 2: the method 'append' is not supported"));
  CHECK_THAT(refusal("{{ 'x'.zfill(3) }}"), ContainsSubstring("the method 'zfill' is not supported; loom supports:"));
  CHECK_THAT(refusal("{{ cycler(1, 2) }}"), ContainsSubstring("the function 'cycler' is not supported"));
  CHECK_THAT(refusal("{{ caller() }}"), ContainsSubstring("the function 'caller' is not supported"));
  CHECK_THAT(refusal("{% break %}"), ContainsSubstring("'{% break %}' outside a for loop"));
  CHECK_THAT(refusal("{% macro m() %}{% generation %}x{% endgeneration %}{% endmacro %}"),
             ContainsSubstring("a {% generation %} block inside a macro"));
  CHECK_THAT(refusal("{% for x in y recursive %}{% endfor %}"),
             ContainsSubstring("recursive for loops are not supported"));
  CHECK_THAT(refusal("{{ f(*args) }}"), ContainsSubstring("*args and **kwargs in a call are not supported"));
  CHECK_THAT(refusal("{% set x | upper %}a{% endset %}"), ContainsSubstring("a filter on a block set"));
}

TEST_CASE("bad syntax is refused with its line") {
  const auto refusal = [](const std::string& source) {
    try {
      (void)chat_template::from_text(source);
    } catch (const chat_template_error& error) {
      return std::string(error.what());
    }
    return std::string("(not refused)");
  };
  CHECK_THAT(refusal("a\nb {{ x"), ContainsSubstring("line 2: a tag is not closed ('}}' is missing)"));
  CHECK_THAT(refusal("{% if x %}\nno end"),
             ContainsSubstring("the template ends where 'elif' or 'else' or 'endif' was expected"));
  CHECK_THAT(refusal("{% endif %}"), ContainsSubstring("'{% endif %}' has no block to end"));
  CHECK_THAT(refusal("\n\n{{ 1 + }}"), ContainsSubstring("line 3: unexpected '}}'"));
  CHECK_THAT(refusal("{{ (1 ] }}"), ContainsSubstring("unexpected ']', expected ')'"));
  CHECK_THAT(refusal("{{ 'abc }}"), ContainsSubstring("a string is not closed"));
  CHECK_THAT(refusal("{# never closed"), ContainsSubstring("a comment is not closed"));
  CHECK_THAT(refusal("{{ x @ y }}"), ContainsSubstring("unexpected character '@'"));
  CHECK_THAT(refusal("{% for x y %}{% endfor %}"), ContainsSubstring("expected 'in', found 'y'"));
  CHECK_THAT(refusal("{% macro m(a=1, b) %}{% endmacro %}"),
             ContainsSubstring("without a default follows one with a default"));
  CHECK_THAT(refusal("{{ 99999999999999999999 }}"), ContainsSubstring("does not fit in 64 bits"));
  CHECK_THAT(refusal("\xff{{ x }}"), ContainsSubstring("not valid UTF-8"));
  CHECK_THAT(refusal("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"),
             ContainsSubstring("the template nests deeper than 600 levels"));
  std::string deep;
  for (int k = 0; k < 1000; ++k) deep += "{% if true %}";
  CHECK_THAT(refusal(deep), ContainsSubstring("the template nests deeper than 600 levels"));
}
