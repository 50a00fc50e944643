"""A user's second hour with the recipes, as the mistakes and reruns come (issue #59).

    recipe_user_check.py messages LOOM_RUN TINY_GPT LM_FINETUNE WAN_FINETUNE FINETUNE PLANS
    recipe_user_check.py folders LOOM_RUN TINY_GPT

messages: every recipe's --help exits 0 and bad numbers exit 2 in one line, no crash; a mistyped flag
is named with the flags it is close to; the run files name no machine's paths, so a missing
checkpoint asks for --pretrained; --out and --train.out both given are refused; a JSON Lines file
without the text field names --text-field; a --seq-len that sequence parallelism cannot split names
the --seq-len that can; Wan clips whose patches do not split name the sp_size that does; wan-finetune
given a language model says so; a run folder is announced for what it holds (a new run, one to go
on with, a finished one), the end of a run says its time, evaluations and peak memory, and
lm-finetune says how much data there is and how far into it the run got.

folders: the demo's run-file phase writes everything inside its own folder and reuses the pretrained
model, saying so; pretraining further says that phase 2 starts afresh, and it does.
"""
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "dsl_examples" / "data"
CONFIGS = Path(__file__).resolve().parents[2] / "dsl_examples" / "configs"
failures: list[str] = []


def run(command: list, expect_code: int | None = None, ranks: int = 2, launch: str | None = None) -> str:
    full = [launch, "--nproc-per-node", str(ranks), "--", *command] if launch else command
    done = subprocess.run([str(word) for word in full], capture_output=True, text=True, timeout=300)
    said = done.stdout + done.stderr
    if expect_code is not None and done.returncode != expect_code:
        failures.append(f"{' '.join(map(str, command))}: exit {done.returncode}, not {expect_code}:\n{said[-2500:]}")
    if "terminate called" in said or "Aborted" in said:
        failures.append(f"{' '.join(map(str, command))} crashed:\n{said[-1500:]}")
    return said


def expect(said: str, *pieces: str, where: str) -> None:
    flat = re.sub(r"\s+", " ", said)
    for piece in pieces:
        if piece not in flat:
            failures.append(f"{where}: expected {piece!r} in:\n{said[-2500:]}")


def greedy_continuation(model: Path, tokenizer: Path, prompt: str, new_tokens: int) -> str:
    """transformers' greedy generate of `model` from `prompt`, decoded with the tokenizers library."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM
    text_tokenizer = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    eos = text_tokenizer.token_to_id(json.loads((tokenizer / "tokenizer_config.json").read_text())["eos_token"])
    ids = torch.tensor([text_tokenizer.encode(prompt, add_special_tokens=False).ids])
    with torch.no_grad():
        out = AutoModelForCausalLM.from_pretrained(model).eval().generate(
            ids, max_new_tokens=new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos)
    return text_tokenizer.decode(out[0].tolist(), skip_special_tokens=False)


def messages(loom_run: str, tiny_gpt: str, lm: str, wan: str, finetune: str, plans: str) -> None:
    for program in (tiny_gpt, lm, wan, finetune, plans):
        said = run([program, "--help"], 0)
        expect(said, "Usage", where=f"{Path(program).name} --help")
    for program, flag in ((lm, "--batch-size"), (lm, "--seq-len"), (wan, "--text-len"), (tiny_gpt, "--steps-pretrain")):
        for value in ("abc", "0", "-5", "99999999999999999999"):
            said = run([program, "--config", CONFIGS / "lm_finetune.toml", flag, value], 2)
            if len(said.strip().splitlines()) > 2:
                failures.append(f"{Path(program).name} {flag} {value}: more than a line and the hint:\n{said}")
    expect(run([tiny_gpt, "--steps", "100"], 2), "tiny-gpt has no flag --steps (did you mean --steps-pretrain or "
           "--steps-adapt?)", where="tiny-gpt --steps")
    expect(run([lm, "--config", CONFIGS / "lm_finetune.toml", "--seq-lne", "128"], 2),
           "lm-finetune has no flag --seq-lne (did you mean --seq-len?)", where="lm-finetune --seq-lne")

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        model, tokens, text = root / "model", root / "tokens.bin", root / "text"
        subprocess.run([sys.executable, DATA / "make_lm.py", model, "--family", "qwen3", "--layers", "2", "--hidden",
                        "64"], check=True, capture_output=True)
        subprocess.run([sys.executable, DATA / "make_tokens.py", "/usr/share/common-licenses/GPL-3", tokens],
                       check=True, capture_output=True)
        subprocess.run([sys.executable, DATA / "make_text_data.py", text], check=True, capture_output=True)
        subprocess.run([sys.executable, DATA / "make_lm.py", root / "llama-512", "--family", "llama", "--layers", "1",
                        "--hidden", "64", "--vocab", "512"], check=True, capture_output=True)
        short = ["--batch-size", "2", "--seq-len", "32", "--train.steps=4", "--train.eval_every=2",
                 "--train.checkpoint_every=2"]
        lm_run = [lm, "--config", CONFIGS / "lm_finetune.yaml", "--tokens", tokens, *short]

        expect(run([*lm_run], 1, launch=loom_run), "no checkpoint to fine-tune: give --pretrained DIR",
               where="lm-finetune without --pretrained")
        expect(run([*lm_run, "--pretrained", model, "--out", root / "a", f"--train.out={root / 'b'}"], 2),
               "--out", "and --train.out=", "both name it: give one", where="--out and --train.out")

        out = root / "run"
        first = run([*lm_run, "--pretrained", model, "--out", out], 0, launch=loom_run)
        expect(first, f"lm-finetune: a new run in {out}", "data: ", "tokens to train on in --tokens", "epochs",
               "lm-finetune: finished steps 1 … 4 of 4", "eval loss best", "peak memory per rank (resident), MiB: [",
               f"this summary in {out / 'summary.json'}", where="lm-finetune's first run")
        summary = json.loads((out / "summary.json").read_text())
        if len(summary.get("peak_memory_bytes", [])) != 2 or min(summary["peak_memory_bytes"]) <= 0:
            failures.append(f"summary.json has no peak for each of the 2 ranks: {summary}")
        expect(run([*lm_run, "--pretrained", model, "--out", out], 0, launch=loom_run),
               f"lm-finetune: {out} holds a run of 4 steps already: no step to take", where="lm-finetune again")
        expect(run([*lm_run, "--pretrained", model, "--out", out, "--train.steps=6"], 0, launch=loom_run),
               f"lm-finetune: {out} holds a finished run of 4 steps: going on to 6 steps, with the learning rate of "
               "a 6-step schedule from step 5", where="lm-finetune to more steps")

        odd_length = [arg if arg != "32" else "31" for arg in lm_run]
        expect(run([*odd_length, "--pretrained", model, "--out", root / "sp", "--training.distributed.sp_size=2"], 1,
                   launch=loom_run),
               "--seq-len 31 does not split over sequence_parallel's 2 ranks", "give --seq-len 32, a multiple of 2",
               where="lm-finetune --seq-len 31 under sequence parallelism")

        bodies = root / "bodies.jsonl"
        bodies.write_text("".join(json.dumps({"body": f"line {i}"}) + "\n" for i in range(40)))
        said = run([lm, "--config", CONFIGS / "lm_finetune.yaml", "--data", bodies, "--tokenizer", text / "tokenizer",
                    "--pretrained", root / "llama-512", "--out", root / "bodies", *short], 1, launch=loom_run)
        expect(said, 'the line has no "text" field, only body; --text-field names the field to read',
               "(--skip-malformed skips such lines", where="lm-finetune on lines without the text field")
        prompt = "This License"
        said = run([lm, "--config", CONFIGS / "lm_finetune.yaml", "--data", text / "train.jsonl", "--tokenizer",
                    text / "tokenizer", "--pretrained", root / "llama-512", "--out", root / "text-run", *short,
                    "--merged", "--sample", prompt, "--max-new-tokens", "16"], 0, launch=loom_run)
        expect(said, "documents in --data", "tokenized as they are read", "data: rank 0 read",
               "epochs of its documents", where="lm-finetune's data summary on text")
        expected = greedy_continuation(root / "text-run" / "merged", text / "tokenizer", prompt, 16)
        printed = f'[rank 0] sample from "{prompt}":\n[rank 0]   ' + expected.replace("\n", "\n[rank 0] ") + "\n"
        if printed not in said:
            failures.append(f"lm-finetune --sample (under fsdp, 2 ranks) is not transformers' greedy generate of the "
                            f"merged weights, {expected!r}:\n{said[-1500:]}")

        wan_model, clips, odd = root / "wan", root / "clips", root / "odd-clips"
        subprocess.run([sys.executable, DATA / "make_wan.py", wan_model], check=True, capture_output=True)
        subprocess.run([sys.executable, DATA / "make_wan_latents.py", clips, "--text-dim", "64"], check=True,
                       capture_output=True)
        subprocess.run([sys.executable, DATA / "make_wan_latents.py", odd, "--text-dim", "64", "--height", "6",
                        "--width", "6"], check=True, capture_output=True)
        wan_run = [wan, "--config", CONFIGS / "wan_finetune.yaml", "--text-len", "8", "--train.steps=4"]
        expect(run([*wan_run, "--data", clips, "--pretrained", model, "--out", root / "w"], 1, launch=loom_run),
               "'architectures' is [\"Qwen3ForCausalLM\"]: a transformers model, not a diffusers "
               "WanTransformer3DModel", where="wan-finetune given a Qwen3 checkpoint")
        expect(run([*wan_run, "--data", odd, "--pretrained", wan_model, "--out", root / "w-odd",
                    "--training.distributed.sp_size=2"], 1, launch=loom_run),
               "have 3 × 3 × 3 = 27 tokens after patching", "which 2 ranks cannot split evenly",
               "give training.distributed.sp_size 1 (it divides the tokens and the 2 ranks)", where="wan-finetune, odd clips, sp_size 2")
        merged_out = root / "w-merged"
        said = run([*wan_run, "--data", clips, "--pretrained", wan_model, "--out", merged_out, "--merged"], 0,
                   launch=loom_run)
        expect(said, f"saved {merged_out / 'merged'} (diffusers' format", where="wan-finetune --merged")
        for name in ("config.json", "diffusion_pytorch_model.safetensors"):
            if not (merged_out / "merged" / name).is_file():
                failures.append(f"wan-finetune --merged wrote no {name}")


def folders(loom_run: str, tiny_gpt: str) -> None:
    short = ["--steps-pretrain", "6", "--steps-adapt", "4", "--checkpoint-every", "2"]
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "tg"
        run([tiny_gpt, *short, "--out", out], 0, launch=loom_run)
        before = {p: p.read_bytes() for p in (out / "adapter").iterdir()} | \
                 {p: p.read_bytes() for p in (out / "adapted").iterdir()}
        said = run([tiny_gpt, "--out", out, "--config", CONFIGS / "tiny-gpt-adapt-ddp.toml", "--lora.rank=16",
                    "--train.steps=4"], 0, launch=loom_run)
        expect(said, f"== phase 1: reused, {out / 'pretrained'} holds the weights of 6 steps",
               where="the run-file phase after the demo")
        own = out / "adapt-tiny-gpt-adapt-ddp"
        if json.loads((own / "adapter" / "adapter_config.json").read_text()).get("r") != 16:
            failures.append(f"the run-file phase's adapter is not in {own / 'adapter'} with r 16")
        for path, data in before.items():
            if path.read_bytes() != data:
                failures.append(f"the run-file phase overwrote the first run's {path}")
        said = run([tiny_gpt, "--out", out, "--steps-pretrain", "8", "--steps-adapt", "4", "--checkpoint-every", "2"],
                   0, launch=loom_run)
        expect(said, "holds the weights of 6 steps; going on to --steps-pretrain 8, after which phase 2 starts "
               f"afresh: its checkpoints in {out / 'adapt' / 'checkpoints'} were adapted over the 6-step weights",
               where="pretraining further")
        if "adapt: resumed from" in said or "adapt step     1/4" not in said:
            failures.append(f"phase 2 did not start afresh over the further pretrained weights:\n{said[-2500:]}")


def main() -> int:
    mode, programs = sys.argv[1], sys.argv[2:]
    (messages if mode == "messages" else folders)(*programs)
    for failure in failures:
        print(f"FAIL: {failure}\n")
    print(f"recipe_user_check {mode}: {'ok' if not failures else f'{len(failures)} failures'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
