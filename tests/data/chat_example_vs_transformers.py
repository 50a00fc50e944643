"""loom::data::chat_example (chat-example-probe) against transformers and TRL's rules, record by
record, with real tokenizer layouts trained here with the tokenizers library (no hub): Qwen2's
(byte-level BPE, Llama 3's split pattern, NFC), Llama 3's (the same pattern, ignore_merges, a BOS
post-processor) and Llama 2's (SentencePiece-style BPE with byte fallback, Prepend and Replace
normalizers, a BOS post-processor), each with its family's markup as special tokens, saved as model
folders (tokenizer.json, tokenizer_config.json, chat_template.jinja) that loom and AutoTokenizer both read.

1. Templates with {% generation %} blocks (loom-chat.jinja, and generation-block variants of the real
   Qwen2.5 and Llama 3.1 templates made here, which render the same text as the originals): loom's
   ids are apply_chat_template(tokenize=True, return_dict=True, return_assistant_tokens_mask=True)'s
   input_ids and its labelled positions that call's assistant_masks (which is what TRL's SFTTrainer
   trains on with assistant_only_loss).
2. Templates without them (the real Qwen2.5, Llama 3.1 and Qwen3 templates): TRL is not in .venv, and
   TRL has no rule of its own for such templates (assistant_only_loss needs generation blocks: TRL
   swaps in patched templates for some families and otherwise stops), so loom's labels are checked
   against the rule loom documents, computed here with transformers' renders and offsets: each
   assistant message's part is what rendering the conversation through it adds after rendering the
   conversation before it with the generation prompt, and a token is labelled when its offsets meet
   a part; where a prefix is not the start of the whole (Qwen3 drops earlier turns' think blocks),
   loom must refuse. The same labels must also be transformers' own assistant_masks on the
   generation-block variant, where there is one. ids are apply_chat_template's.
3. prompt/completion records, against TRL's rules as trl/trainer/sft_trainer.py states them (TRL is not
   in .venv: add_eos, tokenize_fn and DataCollatorForLanguageModeling are re-stated here) and loom's.
   Plain strings: TRL's rule (the completion gets the EOS
   text unless it ends with it, prompt and prompt + completion tokenized with the tokenizer's special
   tokens, the tokens past the prompt's count labelled) and the rule loom documents (the tokenizer's
   BOS where it has one, the text tokenized without special tokens, the tokens meeting the
   completion's bytes labelled, the EOS id appended unless it ends the tokens, and labelled). Lists of
   messages: TRL's rule (apply_chat_template of the prompt with the generation prompt and of prompt +
   completion, the tokens past the prompt's count labelled; with generation blocks, and
   assistant_only_loss, only those assistant_masks also marks) and loom's (the bytes after the
   rendered prompt, and of those the generation blocks' where the template has them).
   Each loom result must equal the documented rule's, and TRL's but for one kind of difference
   (SEAM, below, checked on the tokens, not assumed), which the test reports with its records and
   does not fail; any other difference fails it.

Also: ShareGPT records (from/value, human/gpt) against the same messages in OpenAI's shape, loss on
every token (labels are the ids), add_generation_prompt, tools. The test then checks that it can
fail: one flipped label and one changed id in loom's output must each be reported.

    chat_example_vs_transformers.py --probe build/tests/data/chat-example-probe [--keep DIR] [--show N]
"""
import argparse
import copy
import json
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast
from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "chat_templates"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")

sys.path.insert(0, str(HERE))
from chat_template_vs_jinja import UNICODE  # noqa: E402 - the same Unicode-heavy messages as the template check's

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather at a place — température, 天气",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "City, e.g. Zürich"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["location"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
]

SYSTEM = {"role": "system", "content": "You are a careful assistant. Réponds brièvement."}


def user(text):
    return {"role": "user", "content": text}


def assistant(text, **more):
    return {"role": "assistant", "content": text, **more}


def call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def conversations(family):
    """(name, messages, uses tools) of the `messages` records for one template family."""
    turns = [user("What is 2 + 2?"), assistant("4."), user("And times 3?"),
             assistant("12, since (2 + 2) × 3 = 12."), user("Thanks!"), assistant("You're welcome.")]
    convs = [
        ("system and turns", [SYSTEM] + turns, False),
        ("turns only", turns, False),
        ("one exchange", [user("Hello"), assistant("Hi there!")], False),
        ("an empty assistant message", [user("Say nothing."), assistant(""), user("Good."), assistant("👍")], False),
        ("empty messages", [user(""), assistant(""), user(""), assistant("")], False),
        ("ends with a user message", [SYSTEM, user("Hi"), assistant("Hello"), user("Bye")], False),
        ("whitespace around the reply", [user("pad"), assistant("  padded reply \n\n"), user("x"),
                                         assistant("\n\nstarts with newlines")], False),
        ("markup as text", [user("What does <|im_end|> or <|eot_id|> do?"),
                            assistant("It ends a turn: <|im_end|> in ChatML, <|eot_id|> in Llama 3.")], False),
        ("a long reply", [user("Count."), assistant(" ".join(str(k) for k in range(200)))], False),
    ]
    for k, text in enumerate(UNICODE):
        convs.append((f"unicode {k}", [{"role": "system", "content": UNICODE[(k + 3) % len(UNICODE)]}, user(text),
                                       assistant(UNICODE[(k + 1) % len(UNICODE)]), user(text[::-1]),
                                       assistant(UNICODE[(k + 5) % len(UNICODE)])], False))
    if family in ("qwen2.5", "loom-chat", "llama3.1", "qwen3"):
        weather = call("call9abcdefgh", "get_weather", {"location": "Zürich", "unit": "celsius"})
        convs.append(("tool call and result", [
            SYSTEM, user("What's the weather in Zürich? 天气怎么样？"), assistant("", tool_calls=[weather]),
            {"role": "tool", "tool_call_id": "call9abcdefgh", "name": "get_weather",
             "content": json.dumps({"temperature": 21.5, "condition": "sunny ☀"}, ensure_ascii=False)},
            assistant("It is 21.5 °C and sunny ☀.")], True))
        convs.append(("tool call, no system", [
            user("Weather in Oslo?"), assistant("", tool_calls=[call("c1", "get_weather", {"location": "Oslo"})]),
            {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "-3 °C"},
            assistant("Cold: -3 °C.")], True))
        if family != "llama3.1":  # Llama 3.1 takes one call a message
            convs.append(("two tool calls with text", [
                user("Both please."),
                assistant("Calling both.", tool_calls=[call("s1", "search", {"query": "天气 Zürich"}), weather]),
                {"role": "tool", "tool_call_id": "s1", "name": "search", "content": "[\"news 1\", \"news 2\"]"},
                {"role": "tool", "tool_call_id": "call9abcdefgh", "name": "get_weather", "content": "sunny"},
                assistant("Done.")], True))
    if family in ("loom-chat", "qwen3"):
        convs.append(("reasoning", [
            user("Think first: 17 × 23?"), assistant("391", reasoning_content="17 × 20 + 17 × 3 = 340 + 51 = 391."),
            user("And 19 × 21?"), assistant("399", reasoning_content="(20 − 1)(20 + 1) = 399.")], False))
        convs.append(("reasoning in one exchange", [
            user("Why?"), assistant("<think>\nbecause of 理由\n</think>\n\nBecause.")], False))
    return convs


def prompt_completions(family):
    """(name, prompt, completion, uses tools) of the conversational prompt/completion records."""
    records = [
        ("system and user", [SYSTEM, user("What is 2 + 2?")], [assistant("4.")], False),
        ("user only, unicode", [user(UNICODE[0])], [assistant(UNICODE[1])], False),
        ("earlier turns in the prompt", [user("Hi"), assistant("Hello!"), user("Bye")], [assistant("Ciao ✓")], False),
        ("an empty completion", [user("Say nothing.")], [assistant("")], False),
        ("a completion of several messages", [user("Q1")], [assistant("A1"), user("Q2"), assistant("A2")], False),
        ("a completion opening with newlines", [user("pad")], [assistant("\n\nstarts with newlines")], False),
    ]
    if family in ("qwen2.5", "loom-chat", "llama3.1"):
        records.append(("a tool call", [user("Weather in Oslo?")],
                        [assistant("", tool_calls=[call("c1", "get_weather", {"location": "Oslo"})])], True))
    return records


def plain_prompt_completions(eos):
    """(name, prompt, completion) of the prompt/completion records as plain text."""
    return [
        ("a sentence", "The sky is", " blue."),
        ("a question", "Translate to French: cheese\n", "fromage"),
        ("unicode", "数字：", "一二三 👍🏽 e\u0301"),
        ("an empty prompt", "", "all of it is the completion"),
        ("an empty completion", "Nothing follows", ""),
        ("spaces at the seam", "Q: 2 + 2?  ", "  A: 4  "),
        ("a word cut at the seam", "Hel", "lo world"),
        ("a combining mark at the seam", "cafe", "\u0301 au lait"),
        ("the EOS already there", "Q: 2 + 2?\nA:", " 4" + eos),
        ("markup inside", "<|im_start|>user\nhi<|im_end|>\n", "<|im_start|>assistant\nhello<|im_end|>"),
    ]


# ------------------------------------------------------------------------------------------------
# Tokenizers and templates


def corpus():
    lines = []
    for family in ("qwen2.5", "loom-chat", "llama3.1"):
        for _, messages, _ in conversations(family):
            lines += [str(m.get("content", "")) for m in messages]
    markup = ["<|im_start|>assistant\n", "<|im_start|>user\n", "system\n", "You are Qwen, created by Alibaba Cloud.",
              "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n", "<tool_call>\n{\"name\": ",
              "\n</tool_call>", "<tool_response>\n", "\n</tool_response>", "<think>\n", "\n</think>\n\n",
              "\"arguments\""]
    return (lines + markup + UNICODE) * 10 + ["the weather in Zürich and the news, today and tomorrow"] * 5


CHATML = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3 = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
          "<|eom_id|>", "<|python_tag|>"]


def qwen2_tokenizer():
    """Qwen2's layout: NFC, Llama 3's split pattern, byte-level BPE; ChatML's markup as special tokens."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=CHATML,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    return tok, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}


def llama3_tokenizer():
    """Llama 3's layout: its split pattern, byte-level BPE with ignore_merges, a BOS post-processor."""
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=LLAMA3,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])])
    return tok, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}


def llama2_tokenizer():
    """Llama 2's layout: SentencePiece-style BPE with byte fallback (Prepend and Replace normalizers,
    the <0xNN> tokens after the specials), a BOS post-processor; ChatML's markup added as special tokens."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>"]
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=specials, limit_alphabet=120, show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    saved = json.loads(tok.to_str())
    vocab = saved["model"]["vocab"]
    ordered = specials + [f"<0x{b:02X}>" for b in range(256)] + [t for t in sorted(vocab, key=vocab.get)
                                                                  if t not in specials]
    saved["model"]["vocab"] = {t: i for i, t in enumerate(ordered)}
    for added in saved["added_tokens"]:
        added["id"] = saved["model"]["vocab"][added["content"]]
    tok = Tokenizer.from_str(json.dumps(saved))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ["<|im_start|>", "<|im_end|>"]])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def replaced(text, old, new):
    assert text.count(old) == 1, f"the template has {text.count(old)} copies of {old!r}"
    return text.replace(old, new)


def qwen25_generation(original):
    """Qwen2.5's template with {% generation %} around what an assistant message adds after the
    generation prompt '<|im_start|>assistant\\n': its text, tool calls and '<|im_end|>\\n'."""
    text = replaced(original, ' or (message.role == "assistant" and not message.tool_calls) %}', " %}")
    text = replaced(text, """    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}""", """    {%- elif message.role == "assistant" and not message.tool_calls %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- generation %}
        {{- message.content + '<|im_end|>' + '\\n' }}
        {%- endgeneration %}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- generation %}
        {%- if message.content %}
            {{- message.content }}
        {%- endif %}""")
    text = replaced(text, """            {{- '\\n<tool_call>\\n{"name": "' }}""",
                    """            {{- ('\\n' if message.content or not loop.first else '')"""
                    """ + '<tool_call>\\n{"name": "' }}""")
    text = replaced(text, """        {%- endfor %}
        {{- '<|im_end|>\\n' }}""", """        {%- endfor %}
        {{- '<|im_end|>\\n' }}
        {%- endgeneration %}""")
    return text


def llama31_generation(original):
    """Llama 3.1's template with {% generation %} around what an assistant message adds after the
    generation prompt '<|start_header_id|>assistant<|end_header_id|>\\n\\n': its text or its tool call,
    and the end-of-turn token."""
    text = replaced(original, """        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"""
                    """+ message['content'] | trim + '<|eot_id|>' }}""",
                    """        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
        {%- if message.role == 'assistant' %}
            {%- generation %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endgeneration %}
        {%- else %}
            {{- message['content'] | trim + '<|eot_id|>' }}
        {%- endif %}""")
    text = replaced(text, """        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}""",
                    """        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {%- generation %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}""")
    text = replaced(text, """        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}""", """        {%- else  %}""")
    text = replaced(text, """            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}""", """            {{- "<|eot_id|>" }}
        {%- endif %}
        {%- endgeneration %}
    {%- elif message.role == "tool" or message.role == "ipython" %}""")
    return text


def model_folder(root, name, tok, specials, template):
    """A model folder as save_pretrained writes it, read back by AutoTokenizer."""
    folder = root / name
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tok.to_str()), **specials)
    fast.chat_template = template
    fast.save_pretrained(folder)
    return folder, AutoTokenizer.from_pretrained(folder)


# ------------------------------------------------------------------------------------------------
# What transformers and TRL give


def chat(tok, messages, options, **more):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tok.apply_chat_template(copy.deepcopy(messages), tools=options.get("tools"),
                                       add_generation_prompt=options.get("add_generation_prompt", False), **more)


def render(tok, messages, options, add_generation_prompt):
    return chat(tok, messages, {**options, "add_generation_prompt": add_generation_prompt}, tokenize=False)


def transformers_masked(tok, messages, options):
    """apply_chat_template's ids and assistant_masks."""
    out = chat(tok, messages, options, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    return list(out["input_ids"]), list(out["assistant_masks"])


def transformers_spans(tok, messages, options):
    """The character ranges apply_chat_template's generation blocks wrote (what assistant_masks comes from)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, spans = render_jinja_template(
            conversations=[_normalize_chat_messages(copy.deepcopy(messages))], tools=options.get("tools"),
            chat_template=tok.chat_template, return_assistant_tokens_mask=True,
            add_generation_prompt=options.get("add_generation_prompt", False), **tok.special_tokens_map)
    return [tuple(span) for span in spans[0]]


def transformers_ids(tok, messages, options):
    return list(chat(tok, messages, options, tokenize=True, return_dict=True)["input_ids"])


def overlap_mask(offsets, spans):
    """A token is labelled when its offsets meet a span (half-open character ranges)."""
    return [int(any(b < e_span and e > b_span for b_span, e_span in spans)) for b, e in offsets]


def offsets_of(tok, text):
    encoded = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(encoded["input_ids"]), [tuple(o) for o in encoded["offset_mapping"]]


def prefix_rule(tok, messages, options):
    """The rule loom documents for templates without generation blocks: (ids, mask), or None where a
    rendered prefix is not the start of the whole."""
    whole = render(tok, messages, options, options.get("add_generation_prompt", False))
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = render(tok, messages[:i], options, True)
        upto = render(tok, messages[:i + 1], options, False)
        if not upto.startswith(prompt) or not whole.startswith(upto):
            return None
        spans.append((len(prompt), len(upto)))
    ids, offsets = offsets_of(tok, whole)
    return ids, overlap_mask(offsets, spans)


def documented_plain(tok, prompt, completion):
    """loom's rule for plain prompt/completion: the tokenizer's BOS where it has one, then prompt +
    completion without special tokens, the tokens meeting the completion labelled, the EOS id appended
    (unless the last token is it) and labelled."""
    ids, offsets = offsets_of(tok, prompt + completion)
    mask = overlap_mask(offsets, [(len(prompt), len(prompt + completion))])
    if tok.bos_token_id is not None:
        ids, mask = [tok.bos_token_id] + ids, [0] + mask
    if tok.eos_token_id is not None and ids[-1:] != [tok.eos_token_id]:
        ids, mask = ids + [tok.eos_token_id], mask + [1]
    return ids, mask


def trl_plain(tok, prompt, completion):
    """TRL's SFTTrainer on a plain prompt/completion record (completion_only_loss, its default there):
    (ids, mask, where the seam is)."""
    if not completion.endswith(tok.eos_token):
        completion += tok.eos_token
    prompt_ids = list(tok(text=prompt)["input_ids"])
    ids = list(tok(text=prompt + completion)["input_ids"])
    mask = [0] * len(prompt_ids) + [1] * (len(ids) - len(prompt_ids))
    offsets = offsets_of(tok, prompt + completion)[1]
    if tok.bos_token_id is not None and ids[:1] == [tok.bos_token_id]:
        offsets = [(0, 0)] + offsets  # the BOS the post-processor adds covers no text
    return ids, mask, {"at": len(prompt), "offsets": offsets,
                       "prompt_tokens": len(prompt_ids), "prompt_is_prefix": ids[:len(prompt_ids)] == prompt_ids,
                       "generation": False}


def documented_conversational(tok, prompt, completion, options, generation):
    """loom's rule for prompt/completion as messages: the bytes after the rendered prompt (None where
    that is not the start of the whole), and of those only the generation blocks' where the template
    has them."""
    whole = render(tok, prompt + completion, options, options.get("add_generation_prompt", False))
    rendered_prompt = render(tok, prompt, options, True)
    if not whole.startswith(rendered_prompt):
        return None
    ids, offsets = offsets_of(tok, whole)
    completion_part = (len(rendered_prompt), len(whole))
    if not generation:
        return ids, overlap_mask(offsets, [completion_part])
    spans = [(max(begin, completion_part[0]), min(end, completion_part[1]))
             for begin, end in transformers_spans(tok, prompt + completion, options)]
    return ids, overlap_mask(offsets, [(begin, end) for begin, end in spans if begin < end])


def trl_conversational(tok, prompt, completion, options, generation):
    """TRL's SFTTrainer on a conversational prompt/completion record: completion_only_loss's mask, and
    with generation blocks (assistant_only_loss) assistant_masks' too: (ids, mask, where the seam is)."""
    prompt_ids = list(chat(tok, prompt, {**options, "add_generation_prompt": True}, tokenize=True,
                           return_dict=True)["input_ids"])
    if generation:
        ids, assistant = transformers_masked(tok, prompt + completion, options)
    else:
        ids, assistant = transformers_ids(tok, prompt + completion, options), None
    mask = [0] * len(prompt_ids) + [1] * (len(ids) - len(prompt_ids))
    if assistant is not None:
        mask = [a & b for a, b in zip(mask, assistant)]
    whole = render(tok, prompt + completion, options, False)
    return ids, mask, {"at": len(render(tok, prompt, options, True)), "offsets": offsets_of(tok, whole)[1],
                       "prompt_tokens": len(prompt_ids), "prompt_is_prefix": ids[:len(prompt_ids)] == prompt_ids,
                       "generation": generation}


# ------------------------------------------------------------------------------------------------
# Comparing


class Tally:
    def __init__(self):
        self.records = self.tokens = self.labelled = self.refused = self.cross_checked = 0
        self.failures = []
        self.trl_records = self.trl_tokens = 0
        self.trl_divergences = {}  # kind -> [record label]
        self.trl_unexplained = []


def difference(loom, ids, mask):
    """How loom's {"ids", "labels"} differs from (ids, mask), in words; None when equal."""
    if "error" in loom:
        return f"loom refuses the record: {loom['error']}"
    if loom["ids"] != ids:
        at = next((k for k, (a, b) in enumerate(zip(loom["ids"], ids)) if a != b), min(len(loom["ids"]), len(ids)))
        return (f"ids differ at token {at} (loom has {len(loom['ids'])}, expected {len(ids)}): "
                f"loom {loom['ids'][max(0, at - 3):at + 4]}, expected {ids[max(0, at - 3):at + 4]}")
    bad = [k for k, (label, token) in enumerate(zip(loom["labels"], loom["ids"])) if label not in (-100, token)]
    if bad or len(loom["labels"]) != len(loom["ids"]):
        return f"labels are neither -100 nor the token at {bad[:5]} (or their count is not the ids')"
    labelled = [int(label != -100) for label in loom["labels"]]
    if labelled != mask:
        at = [k for k, (a, b) in enumerate(zip(labelled, mask)) if a != b]
        return f"labelled positions differ at tokens {at[:8]}: loom {[labelled[k] for k in at[:8]]}, expected " \
               f"{[mask[k] for k in at[:8]]} (ids {[ids[k] for k in at[:8]]})"
    return None


def check(tally, label, loom, expected):
    """loom's result against the expected (ids, mask), or against a refusal where expected is None."""
    if expected is None:
        if "error" not in loom:
            tally.failures.append(f"{label}: the rendered prefixes do not start the whole, but loom labels it")
        tally.refused += 1
        return
    tally.records += 1
    tally.tokens += len(expected[0])
    tally.labelled += sum(expected[1])
    problem = difference(loom, *expected)
    if problem:
        tally.failures.append(f"{label}: {problem}")


SEAM = "a token crosses the prompt/completion seam (TRL's prompt ids are not the start of its ids): loom labels " \
       "it, as it meets the completion; TRL labels by the prompt's token count"


def trl_divergences(tok, loom, trl):
    """The diagnosed kinds that take loom's result to TRL's (ids, mask, seam), each checked, or None
    where what is left differs."""
    ids, mask, seam = trl
    if "error" in loom:
        return None
    loom_ids = list(loom["ids"])
    labelled = [int(label != -100) for label in loom["labels"]]
    kinds = []
    if loom_ids != ids:
        return None
    differ = [k for k, (a, b) in enumerate(zip(labelled, mask)) if a != b]
    if not differ:
        return kinds
    if any(labelled[k] != 1 for k in differ):
        return None
    seam_tokens = [k for k in differ if seam["offsets"][k][0] < seam["at"] < seam["offsets"][k][1]]
    if seam_tokens:
        if not seam["prompt_is_prefix"] and seam_tokens == [seam["prompt_tokens"] - 1]:
            kinds.append(SEAM)
        else:
            return None
    if any(k not in seam_tokens for k in differ):
        return None
    return kinds


def check_trl(tally, label, tok, loom, trl):
    tally.trl_records += 1
    tally.trl_tokens += len(trl[0])
    problem = difference(loom, trl[0], trl[1])
    if not problem:
        return
    kinds = trl_divergences(tok, loom, trl)
    if not kinds:
        tally.trl_unexplained.append(f"{label}: against TRL's rule, {problem}")
        return
    for kind in kinds:
        tally.trl_divergences.setdefault(kind, []).append(f"{label}: {problem}")


def run_probe(probe, folder, records, flags, keep, tag):
    with tempfile.TemporaryDirectory() as scratch:
        where = Path(keep) if keep else Path(scratch)
        where.mkdir(parents=True, exist_ok=True)
        path = where / f"{tag}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
        done = subprocess.run([probe, str(folder), str(path), *flags], capture_output=True, text=True, encoding="utf-8")
        if done.returncode != 0:
            raise RuntimeError(f"chat-example-probe {tag}: {done.stderr.strip()}")
        out = [json.loads(line) for line in done.stdout.splitlines()]
        if keep:
            (where / f"{tag}.out.jsonl").write_text(done.stdout, encoding="utf-8")
        assert len(out) == len(records), f"{tag}: {len(out)} results for {len(records)} records"
        return out


def flags_of(options, fields="openai"):
    flags = ["--fields", fields]
    if options.get("tools"):
        flags += ["--tools", json.dumps(options["tools"], ensure_ascii=False)]
    if options.get("add_generation_prompt"):
        flags.append("--add-generation-prompt")
    return flags


def sharegpt(messages):
    names = {"user": "human", "assistant": "gpt", "system": "system"}
    return {"conversations": [{"from": names[m["role"]], "value": m["content"]} for m in messages]}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--probe", required=True)
    parser.add_argument("--keep", help="keep the model folders, records and the probe's output in this folder")
    parser.add_argument("--show", type=int, default=1, help="how many records of each TRL difference to print")
    args = parser.parse_args()
    tally = Tally()
    summary = []

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.keep) if args.keep else Path(scratch)
        keep = args.keep

        qwen_tok, qwen_specials = qwen2_tokenizer()
        llama3_tok, llama3_specials = llama3_tokenizer()
        llama2_tok, llama2_specials = llama2_tokenizer()
        qwen25 = (TEMPLATES / "qwen2.5.jinja").read_text(encoding="utf-8")
        llama31 = (TEMPLATES / "llama3.1.jinja").read_text(encoding="utf-8")
        # (model, family, tokenizer, special tokens, template, its generation-block variant's model or None)
        setups = []
        for name, family, tok, specials, template in [
                ("qwen2.5-generation", "qwen2.5", qwen_tok, qwen_specials, qwen25_generation(qwen25)),
                ("llama3.1-generation", "llama3.1", llama3_tok, llama3_specials, llama31_generation(llama31)),
                ("loom-chat", "loom-chat", qwen_tok, qwen_specials, (TEMPLATES / "loom-chat.jinja").read_text("utf-8")),
                ("loom-chat-llama2", "loom-chat", llama2_tok, llama2_specials,
                 (TEMPLATES / "loom-chat.jinja").read_text("utf-8")),
                ("qwen2.5", "qwen2.5", qwen_tok, qwen_specials, qwen25),
                ("llama3.1", "llama3.1", llama3_tok, llama3_specials, llama31),
                ("qwen3", "qwen3", qwen_tok, qwen_specials, (TEMPLATES / "qwen3.jinja").read_text("utf-8"))]:
            folder, hf = model_folder(root, name, tok, specials, template)
            setups.append((name, family, folder, hf, "{% generation" in template or "{%- generation" in template))
        variant_of = {"qwen2.5": "qwen2.5-generation", "llama3.1": "llama3.1-generation"}
        by_name = {name: (folder, hf) for name, _, folder, hf, _ in setups}

        for name, family, folder, hf, generation in setups:
            before = (tally.records, tally.tokens, len(tally.failures))
            convs = conversations(family)
            for add_generation_prompt in (False, True):
                for uses_tools in (False, True):
                    chosen = [(n, m) for n, m, t in convs if t == uses_tools]
                    if not chosen:
                        continue
                    options = {"add_generation_prompt": add_generation_prompt, "tools": TOOLS if uses_tools else None}
                    tag = f"{name}-messages-{int(add_generation_prompt)}{int(uses_tools)}"
                    loom = run_probe(args.probe, folder, [{"messages": m} for _, m in chosen], flags_of(options), keep,
                                     tag)
                    for (conv, messages), result in zip(chosen, loom):
                        label = f"{name} [{conv}, add_generation_prompt={add_generation_prompt}]"
                        if generation:
                            check(tally, label, result, transformers_masked(hf, messages, options))
                            continue
                        expected = prefix_rule(hf, messages, options)
                        if expected is not None and expected[0] != transformers_ids(hf, messages, options):
                            tally.failures.append(f"{label}: the test's own ids are not apply_chat_template's")
                        check(tally, label, result, expected)
                        if expected is not None and family in variant_of:
                            # The same labels are transformers' mask on the generation-block variant.
                            variant = by_name[variant_of[family]][1]
                            if render(variant, messages, options, add_generation_prompt) != \
                                    render(hf, messages, options, add_generation_prompt):
                                tally.failures.append(f"{label}: the generation-block variant renders other text")
                            elif transformers_masked(variant, messages, options) != expected:
                                tally.failures.append(f"{label}: the prefix rule's mask is not transformers' "
                                                      f"assistant_masks on the generation-block variant")
                            else:
                                tally.cross_checked += 1
            # ShareGPT's shape, and the loss on every token, on the conversations without tools.
            plain = [(n, m) for n, m, t in convs if not t and all(x["role"] in ("system", "user", "assistant")
                                                                    and isinstance(x["content"], str) and len(x) == 2
                                                                    for x in m)]
            loom = run_probe(args.probe, folder, [sharegpt(m) for _, m in plain], flags_of({}, "sharegpt"), keep,
                             f"{name}-sharegpt")
            for (conv, messages), result in zip(plain, loom):
                expected = transformers_masked(hf, messages, {}) if generation else prefix_rule(hf, messages, {})
                check(tally, f"{name} [{conv}, ShareGPT]", result, expected)
            loom = run_probe(args.probe, folder, [{"messages": m} for _, m in plain], ["--loss", "every_token"], keep,
                             f"{name}-every-token")
            for (conv, messages), result in zip(plain, loom):
                ids = transformers_ids(hf, messages, {})
                check(tally, f"{name} [{conv}, every token]", result, (ids, [1] * len(ids)))

            # prompt/completion as messages
            records = prompt_completions(family)
            for uses_tools in (False, True):
                chosen = [r for r in records if r[3] == uses_tools]
                if not chosen:
                    continue
                options = {"tools": TOOLS if uses_tools else None}
                loom = run_probe(args.probe, folder, [{"prompt": p, "completion": c} for _, p, c, _ in chosen],
                                 flags_of(options), keep, f"{name}-prompt-completion-{int(uses_tools)}")
                for (conv, prompt, completion, _), result in zip(chosen, loom):
                    label = f"{name} [prompt/completion: {conv}]"
                    documented = documented_conversational(hf, prompt, completion, options, generation)
                    check(tally, label, result, documented)
                    check_trl(tally, label, hf, result, trl_conversational(hf, prompt, completion, options, generation))
            summary.append(f"{name}: {tally.records - before[0]} records, {tally.tokens - before[1]} tokens, "
                           f"{len(tally.failures) - before[2]} differ")

        # prompt/completion as plain text, on each tokenizer
        for name in ("qwen2.5", "llama3.1", "loom-chat-llama2"):
            folder, hf = by_name[name]
            before = (tally.records, tally.tokens, len(tally.failures))
            records = plain_prompt_completions(hf.eos_token)
            loom = run_probe(args.probe, folder, [{"prompt": p, "completion": c} for _, p, c in records], [], keep,
                             f"{name}-plain")
            for (what, prompt, completion), result in zip(records, loom):
                label = f"{name} tokenizer [plain prompt/completion: {what}]"
                documented = documented_plain(hf, prompt, completion)
                check(tally, label, result, documented)
                check_trl(tally, label, hf, result, trl_plain(hf, prompt, completion))
            summary.append(f"{name} tokenizer, plain prompt/completion: {tally.records - before[0]} records, "
                           f"{tally.tokens - before[1]} tokens, {len(tally.failures) - before[2]} differ")

        # The comparison can fail: one flipped label, one changed id.
        folder, hf = by_name["qwen2.5"]
        messages = conversations("qwen2.5")[0][1]
        loom = run_probe(args.probe, folder, [{"messages": messages}], flags_of({}), keep, "self-check")[0]
        expected = prefix_rule(hf, messages, {})
        flipped = copy.deepcopy(loom)
        k = expected[1].index(1)
        flipped["labels"][k] = -100
        changed = copy.deepcopy(loom)
        changed["ids"][0] += 1
        if difference(loom, *expected) is not None or difference(flipped, *expected) is None or \
                difference(changed, *expected) is None:
            tally.failures.append("self-check: a flipped label or a changed id goes unnoticed")

    print("\n".join(summary))
    print(f"compared: {tally.records} records, {tally.tokens} tokens ({tally.labelled} labelled) against "
          f"transformers' masks and the documented rules, {tally.refused} refusals where no rendered prefix starts "
          f"the whole; {tally.cross_checked} prefix-rule masks are transformers' assistant_masks on a "
          f"generation-block variant of the template; {tally.trl_records} records, {tally.trl_tokens} tokens against "
          f"TRL's prompt/completion rules")
    if tally.trl_divergences:
        print("differences from TRL's rules, diagnosed (reported, not failed):")
        for kind, labels in tally.trl_divergences.items():
            print(f" - {kind}: {len(labels)} records")
            for label in labels[:args.show]:
                print(f"     {label}")
    failures = tally.failures + tally.trl_unexplained
    if failures:
        print(f"\n{len(failures)} differences:")
        for failure in failures[:60]:
            print(" -", failure)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
