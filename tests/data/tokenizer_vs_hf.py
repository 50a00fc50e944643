"""loom::data::tokenizer against the tokenizers library, on tokenizers trained here with it (no hub):
byte-level BPE as GPT-2 writes it, as Llama 3 writes it (a Split by its pattern, ignore_merges) and
as Qwen2 writes it (Llama 3's with an NFC normalizer), and SentencePiece-style BPE with byte fallback as Llama 2 (Prepend and Replace normalizers), Mistral
(the Metaspace pre-tokenizer) and Gemma (Replace alone) write it. Over hostile text (a sample of every
Unicode general category, emoji sequences, combining marks, very long words and digit runs,
whitespace runs, control characters, special tokens inside text, many scripts, added tokens that
each layout's normalizer changes or finds in text it changes, chat markup around special tokens) every
text's ids must equal the library's token for token, and decode(ids) its decode, with special tokens
and without; and encode_with_offsets' offsets its `.offsets`, token for token, in bytes of the UTF-8
text (the library's are characters of the Python string), through each layout's post-processor as
its family writes it (GPT-2's trim_offsets, Llama 3's without; and GPT-2's layout with
add_prefix_space and a RoBERTa-style trim, which keeps the space it added).

    tokenizer_vs_hf.py --probe build/tests/data/tokenizer-probe [--keep DIR]
"""
import argparse
import json
import random
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tokenizers import AddedToken

ROOT = Path(__file__).resolve().parents[2]
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SCRIPTS = ["Привет, мир! Как дела?", "你好，世界。今天天气很好。", "こんにちは世界、カタカナとひらがな。", "안녕하세요 세계",
           "مرحبا بالعالم، كيف حالك؟", "שלום עולם", "नमस्ते दुनिया हिन्दी", "สวัสดีชาวโลก ภาษาไทย",
           "Γειά σου Κόσμε ελληνικά", "Ça va? Ünïcödé façade naïve coöperate", "Ẓ̵̡̢̛͎̘͖̯ąłgó žluťoučký kůň"]


def corpus() -> list[str]:
    """What the tokenizers learn from: the repository's documents and some lines of other scripts."""
    lines = []
    for path in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        lines += path.read_text(encoding="utf-8").splitlines()
    return lines + SCRIPTS * 20


def hostile_texts() -> list[str]:
    rng = random.Random(1234)
    by_category: dict[str, list[str]] = {}
    for code in range(0x110000):
        if 0xD800 <= code <= 0xDFFF:
            continue  # surrogates are no Unicode scalar values: a UTF-8 string cannot hold them
        by_category.setdefault(unicodedata.category(chr(code)), []).append(chr(code))
    texts = []
    for category, chars in sorted(by_category.items()):
        sample = rng.sample(chars, min(60, len(chars)))
        texts += ["".join(sample), " ".join(sample), "a" + "b ".join(sample[:10]) + "z"]
    texts += [
        "", " ", "  ", "a", "\n", "\u2581", "\u2581\u2581x", "Ġ", "hello world", " hello  world ",
        "👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇩🇪 😀😃😄 1️⃣ #️⃣", "e\u0301 a\u0308\u0323 " + "x" + "\u0301" * 40,
        "\u212b \u2126 A\u030a \u1100\u1161\u11a8 \ufb01 \u00c5\u0327 \u0344 q\u0307\u0323", "a" * 5000, "ab" * 3000, "".join(rng.choice("abcdefghij") for _ in range(3000)),
        "1234567890" * 200, "3.14159 1,000,000 12345678901234567890 ١٢٣ ४५६ 七八九",
        " " * 100 + "x", "\t" * 50, "\n" * 30, "\r\n" * 20, "x \u00a0\u3000\u2003 y\u2028z\u2029", " \n \n\n  \t\n",
        "I'm you're they'LL He'S don't it's WE'VE", "''''", "'s's's", "\x00\x01\x1f\x7f", "\u200b\u200c\u200d\ufeff",
        "\ue000\uf8ff\U000f0000\ufffe\uffff\U0010ffff",
        "def f(x):\n    return x**2  # comment\n\tpass\n", '{"key": [1, 2.5e-3, null], "k\\u00e9y": "v"}',
        "hello<|endoftext|>world", "<|endoftext|><|endoftext|>", "a <|endoftext|> b", "<|endoftext", "<<|endoftext|>>",
        "<s>x</s>", " <s> ", "<unk>", "x<s>", "<|begin_of_text|>Hi<|end_of_text|>", "  <|eot|>  after", "a<|eot|>",
        "<|sw|> a<|sw|> <|sw|>b (<|sw|>) _<|sw|> 1<|sw|> é<|sw|> e\u0301<|sw|> \u24d0<|sw|> a\u200d<|sw|> ²<|sw|>",
        "<|sw|><|sw|> x<|sw|><|eot|> <|sw|>\t<|sw|>\n-<|sw|>- <|sw|>\u00a0 \u4e2d<|sw|> \u0661<|sw|>",
    ]
    texts += SCRIPTS + [" ".join(SCRIPTS), "\n".join(SCRIPTS)]
    return texts


def byte_level(pattern_split: bool) -> Tokenizer:
    """GPT-2's layout (ByteLevel splitting by its own pattern), or Llama 3's (a Split, then ByteLevel)."""
    tok = Tokenizer(models.BPE(ignore_merges=pattern_split))
    if pattern_split:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        specials = ["<|endoftext|>"]
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    tok.add_special_tokens([AddedToken("<|eot|>", lstrip=True, rstrip=True, special=True),
                            AddedToken("<|sw|>", single_word=True, special=True)])
    tok.add_tokens([AddedToken("worldwide", special=False)])
    return tok


def qwen2() -> Tokenizer:
    """Qwen2's layout: Llama 3's, its text put in Unicode's NFC first."""
    tok = byte_level(True)
    tok.normalizer = normalizers.NFC()
    return tok


def sentencepiece(layout: str) -> Tokenizer:
    """SentencePiece-style BPE with byte fallback: Llama 2's layout (Prepend + Replace normalizers),
    Mistral's (a Metaspace pre-tokenizer) or Gemma's (Replace alone), its <0xNN> tokens after the specials."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    if layout == "llama2":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    elif layout == "mistral":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    else:
        tok.normalizer = normalizers.Replace(" ", "\u2581")
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if layout != "gemma" else []))
    specials = ["<unk>", "<s>", "</s>"]
    # A small alphabet, so that rare characters take the byte fallback.
    trainer = trainers.BpeTrainer(vocab_size=2500, special_tokens=specials, limit_alphabet=150)
    tok.train_from_iterator(corpus(), trainer)
    # The <0xNN> tokens right after the specials, as Llama 2's vocabulary has them.
    saved = json.loads(tok.to_str())
    vocab = saved["model"]["vocab"]
    ordered = specials + [f"<0x{b:02X}>" for b in range(256)] + [t for t in sorted(vocab, key=vocab.get) if t not in specials]
    saved["model"]["vocab"] = {t: i for i, t in enumerate(ordered)}
    for added in saved["added_tokens"]:
        added["id"] = saved["model"]["vocab"][added["content"]]
    return Tokenizer.from_str(json.dumps(saved))


def standard_nfc(tok: Tokenizer, texts: list[str]) -> tuple[list[list[int]], int]:
    """The ids of `tok` (whose normalizer is NFC) for `texts`, each put in NFC by the Unicode standard.
    The library normalizes with Unicode 9.0's data, in which the 98 combining marks and composed
    characters assigned since are unknown, so it leaves them out of order; loom (utf8proc) follows
    Unicode 15. Where Python's unicodedata (Unicode 14) and the library disagree on a text, its ids
    are the library's pipeline run on the standard's NFC; elsewhere, the library's own. Returns the
    ids and how many texts disagree."""
    plain = Tokenizer.from_str(tok.to_str())
    plain.normalizer = None
    ids, disagree = [], 0
    for text in texts:
        standard = unicodedata.normalize("NFC", text)
        if tok.normalizer.normalize_str(text) == standard:
            ids.append(tok.encode(text, add_special_tokens=False).ids)  # an added token's match as given, too
            continue
        disagree += 1
        ids.append(plain.encode(standard, add_special_tokens=False).ids)
    return ids, disagree


# Added tokens the library matches after normalization (normalized, as tokenizer.add_tokens writes a
# token that is not special) and one it matches in the text as given, and texts that normalization
# changes around and inside them: a decomposed é that NFC composes (and a mark after the token's last
# letter that NFC composes with it), spaces that Llama 2's and Gemma's normalizers turn into ▁ (so
# Llama 2's normalized "café" is "▁café" and both find "new york" as "new▁york"), the same words as
# given; the flags judged in the normalized text (single_word's neighbours, lstrip's and rstrip's
# whitespace, which ▁ is not); a normalized special token, which the library names by its normalized
# content and so does not skip in decoding where the normalizer changes it (Llama 2's "▁<|norm|>").
NORMALIZED_ADDED, AS_GIVEN_ADDED, SPACED_ADDED, FLAGGED_ADDED = "caf\u00e9", "na\u00efve", "new york", "\u00e9clair"
NORMALIZED_SPECIAL = "<|norm|>"
NORMALIZATION_TEXTS = [
    "cafe\u0301", "caf\u00e9", "un cafe\u0301 noir", "xcafe\u0301y", "CAFE\u0301", "cafe\u0301\u0301",
    "nai\u0308ve", "na\u00efve", " na\u00efve ", "na\u00efve<|eot|>cafe\u0301", "caf\u00e9 caf\u00e9  cafe\u0301",
    "e\u0301cafe\u0301e\u0301", "\u2581caf\u00e9", "<s>cafe\u0301</s>", "<|sw|>cafe\u0301 <|sw|>",
    "new york", "I love new york", "new\u2581york", "\u2581new\u2581york\u2581", "new  york", "New York",
    "newyork new york!", "new<|eot|>york", "un e\u0301clair ", "xe\u0301clair", "e\u0301clair\u0301",
    " e\u0301clair  x", "e\u0301clair,e\u0301clair", "\u2581e\u0301clair\u2581", "\te\u0301clair\n", "1e\u0301clair",
    "\u00e9clair", "un \u00e9clair ", " \u00e9clair  x", "\u00e9clair,\u00e9clair", "\u00e9clair\u0301 \u00e9clair",
    "<|norm|>", "a <|norm|> b", "x<|norm|>", "<|norm|><|eot|><|norm|>cafe\u0301",
]


# The special tokens of the families' chat templates (Qwen's and Llama 3's, Mistral's, Gemma's), as
# their files add them: special, matched in the text as given.
CHAT_SPECIALS = ["<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "[INST]",
                 "[/INST]", "<start_of_turn>", "<end_of_turn>"]
# Texts for the offsets above all: rendered chats, the special tokens in them given by their byte
# ranges, CJK, emoji, combining marks, spaces and newlines at either end and in runs, and characters
# the SentencePiece layouts' small alphabet takes through byte fallback (a token of each byte of a
# character, all with the character's span).
OFFSET_TEXTS = [
    "<|im_start|>user\nhi<|im_end|>\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat's 2+2?<|im_end|>\n"
    "<|im_start|>assistant\n4, \u4e5f\u5c31\u662f\u56db \U0001F600<|im_end|>\n",
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
    "<|end_header_id|>\n\n  caf\u00e9 cafe\u0301?  <|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "<s>[INST] Bonjour, \u00e7a va ? [/INST] Tr\u00e8s bien, merci ! \U0001F44B\U0001F3FD</s>",
    "<bos><start_of_turn>user\n\u3053\u3093\u306b\u3061\u306f<end_of_turn>\n<start_of_turn>model\n"
    "\u3084\u3042\uff01<end_of_turn>\n",
    "<|im_start|>user  <|eot|>  hi<|im_end|><|im_start|>assistant\n<|sw|> caf\u00e9 new york<|im_end|>",
    "<|im_end|>", "x<|im_start|>", "<|im_start|><|im_end|>", "<|im_start|> <|im_end|>", "<|im_start|>\n\n\n<|im_end|>",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\u4e2d\u6587\u6587\u672c\uff0c\ud55c\uad6d\uc5b4 "
    "\ud14d\uc2a4\ud2b8\u3002",
    "\U0001F469\U0001F3FD\u200D\U0001F4BB coding \U0001F9D1\u200D\U0001F91D\u200D\U0001F9D1 together \U0001F1EF\U0001F1F5!",
    "S\u0302\u030C e\u0323\u0301 a\u0301\u0302\u0323 Z\u0335\u0321\u031B \u0915\u094D\u0937 \u1112\u1161\u11AB",
    "   leading", "trailing   ", "  both  ", " \t mixed \u3000", " ", "\u3000x\u3000", " \u00e9 ",
    "a\n\n\nb", "\n\n\n\n", "x \n\n y", "line\r\n\r\nnext\n", "\n  \n", "end\n\n",
    "\u16A0\u16C7\u16BB\u16EB\u16D2\u16E6\u16A6 \U0001D518\U0001D52B\U0001D526 \uA66E \U0001F9EC\U0001FAE0",
    "\u2581 \u2581\u2581x \u0120 \u0120y",
]


def with_added_tokens(tok: Tokenizer) -> Tokenizer:
    tok.add_tokens([AddedToken(NORMALIZED_ADDED, normalized=True),
                    AddedToken(AS_GIVEN_ADDED, normalized=False, special=False),
                    AddedToken(SPACED_ADDED, normalized=True),
                    AddedToken(FLAGGED_ADDED, normalized=True, single_word=True, lstrip=True, rstrip=True)])
    tok.add_special_tokens([AddedToken(NORMALIZED_SPECIAL, normalized=True, special=True)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CHAT_SPECIALS])
    return tok


def with_post_processor(layout: str, tok: Tokenizer) -> Tokenizer:
    """The post-processor each family's tokenizer.json has; the special tokens a template adds are not
    added here (add_special_tokens=False), so what matters is the offsets a ByteLevel one trims."""
    bos = ("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>")) if layout in ("llama3", "qwen2") else \
        ("<s>", tok.token_to_id("<s>")) if tok.token_to_id("<s>") is not None else None
    template = [processors.TemplateProcessing(single=f"{bos[0]} $A", special_tokens=[bos])] if bos else []
    if layout == "gpt2":  # GPT-2's: spaces trimmed off the offsets
        tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=True)
    elif layout == "gpt2-prefix":  # RoBERTa's: a space put before each piece, kept in the first token's offsets
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        end_of_text = ("<|endoftext|>", tok.token_to_id("<|endoftext|>"))
        tok.post_processor = processors.Sequence([
            processors.RobertaProcessing(end_of_text, end_of_text, trim_offsets=True, add_prefix_space=True)])
    elif layout == "llama3":  # Llama 3's: no trimming, then the BOS
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)] + template)
    elif layout == "qwen2":
        tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    else:  # Llama 2's, Mistral's and Gemma's: the BOS alone
        tok.post_processor = template[0] if template else None
    return tok


def byte_offsets(text: str, offsets: list[tuple[int, int]]) -> list[list[int]]:
    """The library's character offsets into `text` as offsets into its UTF-8 bytes."""
    starts = [0]
    for character in text:
        starts.append(starts[-1] + len(character.encode("utf-8")))
    return [[starts[begin], starts[end]] for begin, end in offsets]


def compare(name: str, tok: Tokenizer, probe: str, folder: Path, texts: list[str]) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    texts_file, out_file = folder / "texts.json", folder / "loom.json"
    texts_file.write_text(json.dumps(texts))
    done = subprocess.run([probe, str(folder), str(texts_file), str(out_file)], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"{name}: tokenizer-probe failed: {done.stderr.strip()}")
        return 1
    loom = json.loads(out_file.read_text())
    failures = 0
    encodings = [tok.encode(text, add_special_tokens=False) for text in texts]
    # The offsets of a text the library puts in NFC otherwise than the standard does are not compared:
    # its reference ids come from the standard's NFC, a text of other characters.
    offsets_compared = [True] * len(texts)
    if tok.normalizer is not None and "NFC" in tok.normalizer.__class__.__name__:
        reference, disagree = standard_nfc(tok, texts)
        offsets_compared = [ids == e.ids for ids, e in zip(reference, encodings)]
        print(f"{name}: {disagree} text(s) the library puts in NFC otherwise than Unicode's data does: their ids are "
              f"the library's on the standard's NFC, their offsets left out")
    else:
        reference = [e.ids for e in encodings]
    offset_failures, offset_tokens = 0, 0
    for i, text in enumerate(texts):
        theirs = reference[i]
        ours = loom["ids"][i]
        expected = (theirs, tok.decode(theirs, skip_special_tokens=False), tok.decode(theirs, skip_special_tokens=True))
        got = (ours, loom["decoded"][i], loom["decoded_skipping_special"][i])
        if got != expected:
            failures += 1
            if failures <= 5:
                at = next((k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
                print(f"{name}: text {i} {text[:80]!r}{'...' if len(text) > 80 else ''}")
                if isinstance(ours, str):
                    print(f"  loom refused it: {ours}")
                elif ours != theirs:
                    print(f"  ids differ at token {at}: loom {ours[at:at + 8]} ({[tok.id_to_token(t) for t in ours[at:at + 8]]})"
                          f" against {theirs[at:at + 8]} ({[tok.id_to_token(t) for t in theirs[at:at + 8]]})")
                else:
                    print(f"  decoded {got[1][:80]!r} / {got[2][:80]!r} against {expected[1][:80]!r} / {expected[2][:80]!r}")
            continue
        if not offsets_compared[i]:
            continue
        theirs_offsets, ours_offsets = byte_offsets(text, encodings[i].offsets), loom["offsets"][i]
        offset_tokens += len(theirs_offsets)
        if ours_offsets != theirs_offsets:
            offset_failures += 1
            if offset_failures <= 5:
                at = next((k for k, (a, b) in enumerate(zip(ours_offsets, theirs_offsets)) if a != b),
                          min(len(ours_offsets), len(theirs_offsets)))
                encoded = text.encode("utf-8")
                print(f"{name}: text {i} {text[:80]!r}{'...' if len(text) > 80 else ''}")
                print(f"  offsets differ at token {at} ({tok.id_to_token(theirs[at]) if at < len(theirs) else None!r}):"
                      f" loom {ours_offsets[at:at + 4]} against {theirs_offsets[at:at + 4]}"
                      f" ({[encoded[b:e].decode('utf-8', 'replace') for b, e in theirs_offsets[at:at + 4]]})")
    tokens = sum(len(e.ids) for e in encodings)
    print(f"{name}: {len(texts) - failures} of {len(texts)} texts ({tokens} tokens) equal to the tokenizers library's,"
          f" ids and decoded text; offsets of {sum(offsets_compared) - offset_failures} of {sum(offsets_compared)}"
          f" texts ({offset_tokens} tokens) equal")
    return failures + offset_failures


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", required=True)
    ap.add_argument("--keep", type=Path, help="keep the tokenizers and outputs in this folder")
    args = ap.parse_args()
    texts = hostile_texts() + NORMALIZATION_TEXTS + OFFSET_TEXTS
    kinds = {"gpt2": lambda: byte_level(False), "llama3": lambda: byte_level(True),
             "qwen2": qwen2, "llama2": lambda: sentencepiece("llama2"), "mistral": lambda: sentencepiece("mistral"),
             "gemma": lambda: sentencepiece("gemma")}
    kinds = {name: (lambda name=name, make=make: with_post_processor(name, with_added_tokens(make())))
             for name, make in kinds.items()}
    with tempfile.TemporaryDirectory() as tmp:
        base = args.keep or Path(tmp)
        failures = 0
        for name, make in kinds.items():
            tok = make()
            failures += compare(name, tok, args.probe, base / name, texts)
            if name == "gpt2":  # GPT-2's layout again, with a space put before each piece (RoBERTa's)
                prefixed = with_post_processor("gpt2-prefix", Tokenizer.from_str(tok.to_str()))
                failures += compare("gpt2-prefix", prefixed, args.probe, base / "gpt2-prefix", texts)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
