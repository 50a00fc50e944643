"""loom::data::chat_template against transformers' apply_chat_template (Python's jinja2 under
transformers' settings), byte for byte.

Templates: the real ones of Llama 3.1 and 3.2, Qwen2.5, Qwen3, Mistral Small 3.1 and Gemma 3
(tests/data/chat_templates/README.md says where each was read), and loom's own (loom-chat.jinja,
loom-constructs.jinja and the snippets below), which together use every construct of the subset.
Conversations: a system prompt, several turns, empty messages, Unicode-heavy messages (CJK, emoji
sequences, combining marks, RTL, odd whitespace), tool calls and tool results, reasoning, content
blocks, add_generation_prompt on and off, Qwen3's enable_thinking. For each, loom's text must equal
apply_chat_template's (or both must fail, loom's message holding raise_exception's), and where the
template has {% generation %} blocks, loom's byte ranges must be transformers' character ranges and
the assistant mask apply_chat_template(return_assistant_tokens_mask=True) gives must equal the mask
loom's ranges give on the same tokens.

    chat_template_vs_jinja.py --probe build/tests/data/chat-template-probe [--keep DIR]
"""
import argparse
import copy
import json
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import jinja2
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "chat_templates"

UNICODE = [
    "你好，世界！今天天气很好。これは日本語です。안녕하세요",
    "👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇩🇪 1️⃣ — emoji, flags and keycaps",
    "e\u0301 a\u0308\u0323 Ẓ̵̡̢̛͎̘ combining marks " + "x" + "\u0301" * 12,
    "مرحبا بالعالم، كيف حالك؟ שלום עולם \u200fRTL\u200e mixed",
    "\u3000ideographic space and nbsp\u00a0inside\u2003 ",
    "  leading and trailing whitespace\n\n",
    "tabs\tand\nnewlines\r\nand a quote ' and a \" and a backslash \\",
    "Ελληνικά Кириллица देवनागरी ไทย",
]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather at a place — température, 天气",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "City, e.g. Zürich"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7.5}},
            "required": ["location"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                          "filters": {"type": "array", "items": {"type": "string"}}},
                       "required": ["query"]},
        "return": {"type": "string"}}},
]
DOCUMENTS = [{"title": "the first document", "text": "  Some text with ünïcödé.  "},
             {"title": "ANOTHER one", "text": "更多的文字"}, {"text": "untitled text"}]


def call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def conversations(family):
    """(name, messages, render options) for one template family."""
    sys_msg = {"role": "system", "content": "You are a careful assistant. Réponds brièvement."}
    turns = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4."},
             {"role": "user", "content": "And times 3?"}, {"role": "assistant", "content": "12, since (2 + 2) × 3 = 12."},
             {"role": "user", "content": "Thanks!"}]
    convs = [
        ("system and turns", [sys_msg] + turns),
        ("turns only", turns),
        ("one user message", [{"role": "user", "content": "Hello"}]),
        ("empty messages", [{"role": "user", "content": ""}, {"role": "assistant", "content": ""},
                            {"role": "user", "content": ""}]),
        ("empty system", [{"role": "system", "content": ""}, {"role": "user", "content": "hi"}]),
        ("a null field", [{"role": "user", "content": "hi", "name": None},
                          {"role": "assistant", "content": "hello", "tool_calls": None},
                          {"role": "user", "content": "bye"}]),
    ]
    for k, text in enumerate(UNICODE):
        convs.append((f"unicode {k}", [{"role": "system", "content": UNICODE[(k + 3) % len(UNICODE)]},
                                       {"role": "user", "content": text},
                                       {"role": "assistant", "content": UNICODE[(k + 1) % len(UNICODE)]},
                                       {"role": "user", "content": text[::-1]}]))
    convs.append(("all unicode at once", [{"role": "user", "content": "\n".join(UNICODE)}]))
    if family in ("qwen2.5", "qwen3", "loom-chat", "llama3.1", "llama3.2", "mistral"):
        weather_call = call("call9abcdefgh", "get_weather", {"location": "Zürich", "unit": "celsius", "days": 2})
        search_call = call("callsearch42", "search", {"query": "天气 Zürich", "filters": ["news", "ünï"]})
        tool_turns = [
            {"role": "user", "content": "What's the weather in Zürich? 天气怎么样？"},
            {"role": "assistant", "content": "", "tool_calls": [weather_call]},
            {"role": "tool", "tool_call_id": "call9abcdefgh", "name": "get_weather",
             "content": json.dumps({"temperature": 21.5, "condition": "sunny ☀"}, ensure_ascii=False)},
            {"role": "assistant", "content": "It is 21.5 °C and sunny ☀."},
            {"role": "user", "content": "Search for news, then the weather again."},
        ]
        convs.append(("tool call and result", [sys_msg] + tool_turns))
        convs.append(("tool call, no system", tool_turns))
        if family not in ("llama3.1", "llama3.2"):  # Llama 3.x refuses several calls in one message
            convs.append(("two tool calls", [
                {"role": "user", "content": "Both please."},
                {"role": "assistant", "content": "Calling both.", "tool_calls": [search_call, weather_call]},
                {"role": "tool", "tool_call_id": "callsearch42", "name": "search", "content": "[\"news 1\", \"news 2\"]"},
                {"role": "tool", "tool_call_id": "call9abcdefgh", "name": "get_weather", "content": "sunny"},
                {"role": "assistant", "content": "Done."},
                {"role": "user", "content": "ok"}]))
        if family != "mistral":
            convs.append(("tool result as an object", [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "tool_calls": [call("call9abcdefgh", "get_weather", '{"location": "Oslo"}')]},
                {"role": "tool", "tool_call_id": "call9abcdefgh", "name": "get_weather",
                 "content": {"temperature": -3, "wind": [1.5, 2.0], "note": None}}]))
    if family in ("qwen3", "loom-chat"):
        convs.append(("reasoning_content", [
            {"role": "user", "content": "Think first: 17 × 23?"},
            {"role": "assistant", "content": "391", "reasoning_content": "17 × 23 = 17 × 20 + 17 × 3 = 340 + 51 = 391."},
            {"role": "user", "content": "And 19 × 21?"},
            {"role": "assistant", "content": "399", "reasoning_content": "\n(20 − 1)(20 + 1) = 400 − 1 = 399.\n"}]))
        convs.append(("inline think blocks", [
            {"role": "user", "content": "Why?"},
            {"role": "assistant", "content": "<think>\nbecause of 理由\n</think>\n\nBecause."},
            {"role": "user", "content": "Sure?"},
            {"role": "assistant", "content": "<think>checking</think>Yes, sure."}]))
        convs.append(("thinking and reasoning aliases", [
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "A", "thinking": "an older field name"},
            {"role": "user", "content": "Q2"},
            {"role": "assistant", "content": "A2", "reasoning": "another name", "reasoning_content": None}]))
        convs.append(("multi-step tool with think", [
            {"role": "user", "content": "Find it."},
            {"role": "assistant", "content": "<think>need search</think>Searching.", "tool_calls": [
                call("callsearch42", "search", {"query": "it"})]},
            {"role": "tool", "content": "found it", "name": "search"},
            {"role": "user", "content": "<tool_response>wrapped</tool_response>"},
            {"role": "assistant", "content": "<think>done now</think>Here it is."}]))
    if family in ("gemma3", "mistral", "loom-chat"):
        convs.append(("content blocks", [
            {"role": "system", "content": [{"type": "text", "text": "System as blocks."}]},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "  What is in the image? 图 "}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A cat 🐈."}]},
            {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}]))
    if family in ("gemma3", "mistral"):
        convs.append(("roles out of order", [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]))
    if family == "loom-chat":
        convs.append(("an unknown role", [{"role": "narrator", "content": "Once upon a time"}]))
        convs.append(("an unknown block", [{"role": "user", "content": [{"type": "audio"}]}]))

    variants = []
    for name, messages in convs:
        for add_generation_prompt in (False, True):
            options = {"add_generation_prompt": add_generation_prompt}
            if "tool" in name and family != "gemma3":
                options["tools"] = TOOLS
            variants.append((f"{name}, add_generation_prompt={add_generation_prompt}", messages, options))
    if family in ("qwen3", "loom-chat"):
        for enable in (True, False):
            variants.append((f"enable_thinking={enable}", [sys_msg] + turns,
                             {"add_generation_prompt": True, "variables": {"enable_thinking": enable}}))
    if family == "llama3.1":
        variants.append(("builtin tools", [
            sys_msg, {"role": "user", "content": "Search it"},
            {"role": "assistant", "tool_calls": [call("x", "brave_search", {"query": "loom"})]},
            {"role": "ipython", "content": "result"}],
            {"add_generation_prompt": True, "tools": TOOLS,
             "variables": {"builtin_tools": ["brave_search", "code_interpreter", "wolfram_alpha"]}}))
    if family in ("llama3.1", "llama3.2"):
        variants.append(("tools in the system message", [sys_msg] + turns,
                         {"tools": TOOLS, "variables": {"tools_in_user_message": False, "date_string": "01 Jan 2025"}}))
        variants.append(("tools with no user message", [sys_msg], {"tools": TOOLS}))
    if family == "loom-chat":
        variants.append(("documents", [sys_msg] + turns, {"documents": DOCUMENTS, "add_generation_prompt": True}))
        variants.append(("default system from a variable", turns, {"variables": {"default_system": "Sé útil."}}))
    return variants


FAMILY_TOKENS = {
    "llama3.1": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama3.2": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "qwen2.5": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "qwen3": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "mistral": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "gemma3": {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"},
    "loom-chat": {"bos_token": "<s>", "eos_token": "</s>"},
}

CONSTRUCT_VALUES = {
    "words": ["banana", "Apple", "cherry", "apple", "date"],
    "numbers": [3, 1, 2, 10, -4, 7],
    "people": [{"name": "Ann", "age": 31, "role": "user", "admin": True},
               {"name": "Bo", "age": 25, "role": "assistant"},
               {"name": "Cé", "age": 31, "role": "user", "admin": False}],
    "scores": {"b": 2, "a": 3, "C": 1},
    "nested": {"inner": {"list": [1, 2.5, "três", None, True], "empty": {}}, "ünï": "cödé"},
}

# One-line templates for the corners of the semantics, rendered on a short conversation.
SNIPPETS = [
    "{{ messages }}", "{{ messages[0] }}", "{{ messages | length }}", "{{ messages[0].content | upper }}",
    "{{ 1.0 }} {{ 100.0 }} {{ 1e15 }} {{ 1e16 }} {{ 123456789.123 }} {{ 0.0001 }} {{ 0.00001 }} {{ -0.0 }} {{ 1/3 }}",
    "{{ 2 ** 62 }} {{ 10 ** 15 * 1.0 }} {{ 3.0 * 2 }} {{ 5 / 5 }} {{ 0.5 + 0.25 }} {{ 1e300 * 1e10 }} {{ -1e300 * 1e10 }}",
    "{{ 'a\\'b' }} {{ ['a\\'b', 'a\"b', 'a\\'\"b', '\\x00\\x7f\\x80\\xa0', '\\u200b\\u2028\\ufeff', 'é😀'] }}",
    "{{ [none, true, 1.5, [], {}, (), (1,), {'k': (1, 2)}] }}",
    "{{ {'a': 1}.items() }} {{ {'a': 1}.keys() }} {{ {'a': 1}.values() }} {{ ({'a': 1} | items | list) }}",
    "{{ 'abc'[::-1] }} {{ 'abc'[5:] }} {{ 'abc'[-10:2] }} {{ [1, 2, 3, 4, 5][4:0:-2] }} {{ [1, 2, 3][::-2] }} {{ [1][-1:] }}",
    "{{ 'x' ~ 1 ~ 1.5 ~ [1] ~ {'a': 'b'} ~ none }}",
    "{{ messages[0].get('role') }} {{ messages[0].get('nope', 'dflt') }} {{ messages[0].items() | list }}",
    "{% for k, v in messages[0] | dictsort %}{{ k }}={{ v }};{% endfor %}",
    "{% for m in messages %}{{ m.role }}{{ ',' if not loop.last }}{% endfor %}",
    "{% for m in messages | reverse %}{{ m.role[0] }}{% endfor %} {{ messages | map(attribute='role') | join('/') }}",
    "{% for c in 'héllo' %}{{ c }}.{% endfor %} {{ 'héllo' | list }} {{ 'héllo' | length }}",
    "{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}",
    "{% set x = 1 %}{% for i in [1] %}{% set x = 5 %}{{ x }}{% endfor %}{{ x }}",
    "{% for i in [1, 2] %}[{{ y }}]{% set y = i %}{% endfor %}[{{ y }}]",
    "{% set ns = namespace(v=0) %}{% for i in range(4) %}{% set ns.v = ns.v + i %}{% endfor %}{{ ns.v }}",
    "{% macro m(a, b=a ~ '!') %}{{ a }}{{ b }}{% endmacro %}{{ m('x') }} {{ m('x', 'y') }}",
    "{% macro m() %}{% set inner = 1 %}{{ inner }}{% endmacro %}{{ m() }}[{{ inner }}]",
    "{% macro rec(n) %}{{ n }}{% if n > 0 %}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(3) }}",
    "{{ undefined_thing }}|{{ undefined_thing.attr }}",
    "{{ (undefined_thing or 'fallback') }} {{ undefined_thing is none }} {{ undefined_thing | string }}",
    "{{ none.attr }}|{{ 'abc'.attr }}|{{ 5.attr }}|{{ messages.attr }}|{{ messages[0].attr }}",
    "{{ messages[99] }}|{{ messages[0]['nope'] }}|{{ messages['x'] }}",
    "{{ 'a' + 1 }}", "{{ 1 / 0 }}", "{{ 5 // 0 }}", "{{ [1] < 'a' }}", "{{ raise_exception('custom failure é') }}",
    "{{ 'a' in 3 }}", "{{ 1 in 'abc' }}", "{{ none | length }}", "{{ 5 | first }}", "{{ messages | tojson }}",
    "{{ undefined_thing | tojson }}", "{{ undefined_thing + 1 }}", "{{ undefined_thing() }}", "{{ 'x'() }}",
    "{% for a, b in [[1, 2, 3]] %}{% endfor %}", "{% for a in 5 %}{% endfor %}", "{{ namespace(a=1).b }}",
    "{{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ messages | selectattr('role') | first }}",
    "{% if messages | selectattr('role', 'eq', 'nobody') %}generator is true{% endif %}",
    "a\n  {% if true %}\n  b\n  {% endif %}\n  c\n",
    "{% if true %}  x  {% endif %}\n{%- if true %}\n y{% endif %}",
    "line1\n    {#- comment -#}\n    line2  {#+ keep #}  line3",
    "{%- for i in [1,2] -%}\n  {{ i }}\n{%- endfor -%}\n",
    "text\r\nwith\rcarriage\r\n{% if true %}\r\nreturns{% endif %}\r\n",
    "{{- '  lead' -}}   \n\n   {{- 'trail  ' }}",
    "ends with two newlines\n\n",
    "{{ 'a' }}\n{# c #}\n{{ 'b' }}\n\n",
    "  {{ 'var keeps indent' }}\n  {% if true %}block loses it{% endif %}",
    "{% for x in [1, 2] %}\n{{ x }}\n{% else %}\nnone\n{% endfor %}\nend",
    "{{ {'b': 1, 'a': 2} | tojson(sort_keys=true, indent=1) }} {{ [[], {}] | tojson(indent=0) }}",
    "{{ '\\u00e9\\u2028' | tojson }} {{ 'é😀' | tojson(ensure_ascii=true) }} {{ 1e16 | tojson }} {{ 1.5 | tojson }}",
    "{{ '%s=%d%%' % ('k', 42) }} {{ 'only %s' % 'one' }}",
    "{{ 'ǅungla ǈ' | title }} {{ 'ǆ' | upper }} {{ 'ÀÉÎ Ωμέγα' | lower }} {{ 'ǆa' | capitalize }} {{ 'ǆa'.title() }}",
    "{{ ' \u3000x\u3000 ' | trim }}|{{ '\u00a0y\u00a0'.strip() }}|{{ 'a\u3000b c'.split() }}",
    "{{ 'a-b c(d{e[f<g' | title }} {{ 'x  y' | title }}",
    "{{ [3, 1, 2] | sort | first }} {{ ['b', 'A', 'c'] | sort(reverse=true) }} {{ [[2, 'b'], [1, 'a']] | sort }}",
    "{{ ['a', 'A', 'b'] | unique | list }} {{ [1, 1.0, true, 2] | unique | list }}",
    "{{ 'abc' | center(2) }}|{{ 'abc' | center(6) }}|{{ 'ab' | center(5) }}|{{ 'ab' | center(6) }}|",
    "{{ 'x\ny' | indent(first=true) }}|{{ '' | indent }}|{{ 'x\n' | indent(2, blank=true) }}|",
    "{{ '1e3' | int }} {{ '-12' | int }} {{ '+7' | int }} {{ '0b101' | int(0, 2) }} {{ 'inf' | float }} {{ '1e3' | float }}",
    "{{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ ''.split() }} {{ ''.split(',') }} {{ ' a '.split(' ') }}",
    "{{ 'aXbXc'.replace('X', '') }} {{ 'héllo'.find('l') }} {{ 'héllo'.count('') }} {{ 'a{}b'.format('{}') }}",
    "{% set a = [1, 2] %}{% set b = a + [3] %}{{ a }} {{ b }} {{ a == [1, 2] }} {{ (1, 2) == [1, 2] }}",
    "{{ loop }}|{% for i in [1] %}{{ loop.length }}{{ loop.depth }}{{ loop.depth0 }}{% endfor %}",
    "{{ range(3) | join(',') }} {{ range(0) | list }} {{ range(-3) | list }}",
    "{{ dict(a=1) | tojson }} {{ dict({'x': 1}, y=2) }} {{ dict([['k', 'v']]) }}",
    "{{ true }}{{ True }}{{ false }}{{ none }}{{ None }}",
    "{{ x if x is defined else 'no x' }} {{ messages[0].role if messages else '' }}",
    "{{ messages[-1]['content'][:3] ~ '…' }}",
    "{% set s %}multi\nline{% endset %}{{ s | replace('\n', ' ') }} {{ s.split('\n') }}",
    "{% generation %}{{ 'generated' }}{% endgeneration %} and {% for m in messages %}{% generation %}{{ m.role }}{% endgeneration %},{% endfor %}",
    "{{ messages | map('tojson') | join('|') }} {{ [1, 2] | map('string') | map('length') | list }}",
    "{{ messages | rejectattr('role', 'in', ['user']) | map(attribute='role') | list }}",
    "{{ [1, 2, 3, 4] | select('divisibleby', 2) | list }} {{ [0, 1, '', 'a', none] | reject | list }}",
    "{{ 'ABC' | lower | upper | reverse }} {{ 'x' | string | length }}",
    "{{ -(2) ** 2 }} {{ (-2) ** 2 }} {{ -2 ** 2 }} {{ 2 * 3 + 4 }} {{ 2 + 3 * 4 }} {{ 10 - 2 - 3 }} {{ 2 ~ 3 + 4 }}",
    "{{ not 1 == 2 }} {{ not (1 == 2) and 3 }} {{ 1 if 0 else 2 if 0 else 3 }}",
    "{{ messages[0].content is string and messages[0].content | length > 0 }}",
    "{{ 7 is divisibleby 7 }} {{ 2.5 is odd }} {{ 3.0 is odd }}",
    "a \u3000{%- if true %}b{% endif %}\n\u3000 {% if true %}c{% endif %}\n\t{# tab #}d",
    "x {%+ if true +%}\n  y\n{%- endif +%}\nz {{+ 'v' }}",
    "{#- c1 -#}  a  {#+ c2 +#}  b  {# c3 #}\n c",
    "{% if true -%}   \u3000\n  x{%- endif %}|{{ 'y' -}} \n\n z",
    "{{ 'nested \\'quotes\\' and \\\\n' }} {{ \"dq 'sq'\" }} {{ '\\101\\x41\\u0041' }}",
    "{{ {'a': {'b': {'c': 1}}}['a']['b'] }} {{ {'a': {'b': 1}} | tojson }}",
    "{{ [1, [2, [3, []]]] | tojson(indent=2) }}",
    "{% for m in messages %}{% if m.role == 'user' %}{% continue %}{% endif %}{{ m.role }}{% endfor %}",
    "{% for a in [1, 2] %}{% for b in [3, 4] %}{% if b == 4 %}{% break %}{% endif %}{{ a }}{{ b }}{% endfor %}{% endfor %}",
    "{{ messages | selectattr('role', 'in', ['user', 'system']) | map(attribute='content') | map('trim') | join(' / ') }}",
    "{{ messages | map(attribute='content') | map('length') | list }} {{ messages | map(attribute='content') | map('replace', 'e', 'E') | list }}",
    "{{ messages[1:] | map(attribute='role') | unique | list | length }} {{ messages | length is odd }}",
    "{{ '%s' % messages[0] }} {{ '%s' % [1] }}",
    "{% set d = {'z': 1, 'a': 2} %}{% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %} {{ d | dictsort | first }}",
    "{{ ['x', 'y'] | join(1) }} {{ [1, none, true] | join('-') }} {{ 'abc' | join('.') }}",
    "{{ 'a.b.c' | replace('.', '') | upper | center(7) }}",
    "{% if not messages %}none{% elif messages | length == 4 %}four{% endif %}",
    "{{ 0.1 * 3 }} {{ 1 / 7 }} {{ 2.0 ** 0.5 }} {{ 1e-7 }} {{ 123e4 }} {{ 5e-324 }} {{ 1.7976931348623157e308 }}",
    "{% set ns = namespace(_hidden=1) %}{{ ns._hidden }}", "{% set ns = namespace() %}{% set ns._x = 1 %}{{ ns }}",
    "{{ 9007199254740993 }} {{ 9007199254740993 == 9007199254740992.0 }} {{ -9223372036854775807 - 1 }}",
]


def build_tokenizer():
    """A small byte-level BPE tokenizer: its token offsets turn character ranges into a token mask."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(UNICODE * 20 + ["<|im_start|>assistant\n", "user", "the weather"] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def char_offset(text, byte_offset):
    return len(text.encode("utf-8")[:byte_offset].decode("utf-8"))


def mask_from_spans(offsets, spans):
    """apply_chat_template's rule: a token is the assistant's if it overlaps a span."""
    mask = [0] * len(offsets)
    span = 0
    for k, (start, end) in enumerate(offsets):
        while span < len(spans) and start >= spans[span][1]:
            span += 1
        if span == len(spans):
            break
        if end > spans[span][0]:
            mask[k] = 1
    return mask


def transformers_render(tokenizer, template, messages, options):
    """apply_chat_template's text, or the exception it raises."""
    variables = options.get("variables", {})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            text = tokenizer.apply_chat_template(
                copy.deepcopy(messages), tools=options.get("tools"), documents=options.get("documents"),
                chat_template=template, add_generation_prompt=options.get("add_generation_prompt", False),
                tokenize=False, **variables)
        return text, None
    except Exception as error:  # noqa: BLE001 - any failure of transformers' is compared with loom's
        return None, error


def transformers_spans(template, messages, options):
    """render_jinja_template's character ranges of the generation blocks."""
    _, indices = render_jinja_template(
        conversations=[_normalize_chat_messages(copy.deepcopy(messages))], tools=options.get("tools"),
        documents=options.get("documents"), chat_template=template, return_assistant_tokens_mask=True,
        add_generation_prompt=options.get("add_generation_prompt", False), **options.get("variables", {}))
    return [list(span) for span in indices[0]]


def run_probe(probe, cases, template_path, keep):
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(keep) if keep else Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        cases_path, out_path = folder / "cases.json", folder / "out.json"
        cases_path.write_text(json.dumps(cases, ensure_ascii=False), encoding="utf-8")
        subprocess.run([probe, str(template_path) if template_path else "-", str(cases_path), str(out_path)],
                       check=True)
        return json.loads(out_path.read_text(encoding="utf-8"))


def compare(label, tokenizer, template, messages, options, loom, failures, generation_checks):
    expected, error = transformers_render(tokenizer, template, messages, options)
    if "load_error" in loom:
        # Refusing at load what fails at render in transformers (a call of an undefined name) is
        # loom's design; refusing what transformers renders is a difference.
        if error is None:
            failures.append(f"{label}: loom refuses the template: {loom['load_error']}")
        return
    if error is not None:
        if "error" not in loom:
            failures.append(f"{label}: transformers fails ({type(error).__name__}: {error}) but loom renders "
                            f"{loom['text']!r}")
        elif isinstance(error, jinja2.exceptions.TemplateError) and type(error) is jinja2.exceptions.TemplateError \
                and str(error) not in loom["error"]:
            failures.append(f"{label}: raise_exception's message {str(error)!r} is not in loom's {loom['error']!r}")
        return
    if "error" in loom:
        failures.append(f"{label}: loom fails ({loom['error']}) where transformers renders {expected!r}")
        return
    if loom["text"] != expected:
        at = next((k for k, (a, b) in enumerate(zip(loom["text"], expected)) if a != b),
                  min(len(loom["text"]), len(expected)))
        failures.append(f"{label}: texts differ at character {at}:\n  loom:         {loom['text'][max(0, at - 60):at + 60]!r}"
                        f"\n  transformers: {expected[max(0, at - 60):at + 60]!r}")
        return
    spans = [[char_offset(expected, b), char_offset(expected, e)] for b, e in loom["generation"]]
    if "{% generation" in template or "{%- generation" in template:
        generation_checks[0] += 1
        wanted = transformers_spans(template, messages, options)
        if spans != wanted:
            failures.append(f"{label}: generation ranges differ: loom {spans}, transformers {wanted}")
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            encoded = tokenizer.apply_chat_template(
                copy.deepcopy(messages), tools=options.get("tools"), documents=options.get("documents"),
                chat_template=template, add_generation_prompt=options.get("add_generation_prompt", False),
                tokenize=True, return_dict=True, return_assistant_tokens_mask=True, **options.get("variables", {}))
        offsets = tokenizer(expected, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        if mask_from_spans(offsets, spans) != encoded["assistant_masks"]:
            failures.append(f"{label}: assistant masks differ")
    elif loom["generation"]:
        failures.append(f"{label}: loom reports generation ranges for a template without generation blocks")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--probe", required=True)
    parser.add_argument("--keep", help="keep the probe's inputs and outputs in this folder")
    args = parser.parse_args()
    tokenizer = build_tokenizer()
    failures = []
    generation_checks = [0]
    summary = []

    families = {"llama3.1": "llama3.1.jinja", "llama3.2": "llama3.2.jinja", "qwen2.5": "qwen2.5.jinja",
                "qwen3": "qwen3.jinja", "mistral": "mistral-small-3.1.jinja", "gemma3": "gemma3.jinja",
                "loom-chat": "loom-chat.jinja"}
    for family, file_name in families.items():
        path = TEMPLATES / file_name
        template = path.read_text(encoding="utf-8")
        variants = conversations(family)
        cases = []
        for _, messages, options in variants:
            case = {"messages": messages, **options}
            case["variables"] = {**FAMILY_TOKENS[family], **options.get("variables", {})}
            cases.append(case)
        results = run_probe(args.probe, cases, path, args.keep and Path(args.keep) / family)
        before = len(failures)
        for (name, messages, options), case, loom in zip(variants, cases, results):
            options = {**options, "variables": case["variables"]}
            compare(f"{file_name} [{name}]", tokenizer, template, messages, options, loom, failures, generation_checks)
        summary.append(f"{file_name}: {len(variants)} renders, {len(failures) - before} differ")

    # loom-constructs.jinja on every conversation of loom-chat's, with the values it works on
    path = TEMPLATES / "loom-constructs.jinja"
    template = path.read_text(encoding="utf-8")
    variants = [(name, messages, {"add_generation_prompt": False, "variables": {"v": CONSTRUCT_VALUES}})
                for name, messages, _ in conversations("loom-chat")]
    results = run_probe(args.probe, [{"messages": m, **o} for _, m, o in variants], path,
                        args.keep and Path(args.keep) / "constructs")
    before = len(failures)
    for (name, messages, options), loom in zip(variants, results):
        compare(f"loom-constructs.jinja [{name}]", tokenizer, template, messages, options, loom, failures,
                generation_checks)
    summary.append(f"loom-constructs.jinja: {len(variants)} renders, {len(failures) - before} differ")

    messages = [{"role": "system", "content": "Sys"}, {"role": "user", "content": "Hé there"},
                {"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "Bye 👋"}]
    cases = [{"template": snippet, "messages": messages, "variables": {}} for snippet in SNIPPETS]
    results = run_probe(args.probe, cases, None, args.keep and Path(args.keep) / "snippets")
    before = len(failures)
    for k, (snippet, loom) in enumerate(zip(SNIPPETS, results)):
        compare(f"snippet {k} {snippet[:50]!r}", tokenizer, snippet, messages, {}, loom, failures, generation_checks)
    summary.append(f"snippets: {len(SNIPPETS)} renders, {len(failures) - before} differ")

    print("\n".join(summary))
    print(f"generation blocks compared (ranges and assistant masks): {generation_checks[0]} renders")
    if failures:
        print(f"\n{len(failures)} differences:")
        for failure in failures[:60]:
            print(" -", failure)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
