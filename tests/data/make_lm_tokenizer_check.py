"""make_lm.py's checkpoints carry a tokenizer that fits them: loom reads it (tokenizer-probe), and
its ids are the tokenizers library's and transformers' AutoTokenizer's, the bytes of the text (as
make_tokens.py's), below the model's vocab_size, with an end-of-text token for joining documents
that no text's bytes give (Latvian and Māori text, whose Ā GPT-2's byte map gives byte 0, and the NUL
byte among them); a --vocab too small for the bytes is refused.

    make_lm_tokenizer_check.py PROBE SOURCE_ROOT
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> int:
    probe, root = sys.argv[1], Path(sys.argv[2])
    failures = []
    texts = [open("/usr/share/common-licenses/GPL-3", encoding="utf-8").read()[:3000],
             "caf\u00e9 cafe\u0301 \u4e2d\u6587 \U0001f600 tabs\tand\nlines", " leading and trailing ", "x",
             "\u0100 \u0101 M\u0101ori, latvie\u0161u valoda", "nul\u0000byte \u00ff\u00fe"]
    with tempfile.TemporaryDirectory() as scratch:
        for vocab in ("256", "512"):
            model = Path(scratch) / f"model-{vocab}"
            subprocess.run([sys.executable, root / "dsl_examples" / "data" / "make_lm.py", model, "--family", "llama",
                            "--layers", "1", "--hidden", "32", "--vocab", vocab], check=True, capture_output=True)
            (Path(scratch) / "texts.json").write_text(json.dumps(texts))
            done = subprocess.run([probe, model, Path(scratch) / "texts.json", Path(scratch) / "loom.json"],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                failures.append(f"vocab {vocab}: loom cannot read make_lm.py's tokenizer: {done.stderr.strip()}")
                continue
            probed = json.loads((Path(scratch) / "loom.json").read_text())
            loom = probed["ids"]

            from tokenizers import Tokenizer
            from transformers import AutoTokenizer
            library = Tokenizer.from_file(str(model / "tokenizer.json"))
            auto = AutoTokenizer.from_pretrained(model)
            config = json.loads((model / "config.json").read_text())
            for text, ours in zip(texts, loom):
                expected = list(text.encode("utf-8"))
                for name, theirs in (("the tokenizers library", library.encode(text, add_special_tokens=False).ids),
                                     ("AutoTokenizer", auto(text, add_special_tokens=False).input_ids),
                                     ("make_tokens.py's bytes", expected)):
                    if ours != theirs:
                        failures.append(f"vocab {vocab}: loom's ids of {text[:30]!r} differ from {name}'s")
                if max(ours) >= config["vocab_size"]:
                    failures.append(f"vocab {vocab}: an id of {text[:30]!r} is not below vocab_size")
            for name, eos in (("AutoTokenizer", auto.eos_token_id), ("loom", probed["eos"])):
                if eos is None or eos != config["eos_token_id"]:
                    failures.append(f"vocab {vocab}: {name}'s end-of-text token is {eos}, config's "
                                    f"{config.get('eos_token_id')}")
        too_small = subprocess.run([sys.executable, root / "dsl_examples" / "data" / "make_lm.py",
                                    Path(scratch) / "model-100", "--vocab", "100"], capture_output=True, text=True)
        if too_small.returncode == 0 or "give --vocab 256 or more" not in too_small.stderr:
            failures.append(f"make_lm.py --vocab 100 is not refused for the byte-level tokenizer: {too_small.stderr}")
    for failure in failures:
        print("FAIL:", failure)
    print("make_lm tokenizer:", "ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
