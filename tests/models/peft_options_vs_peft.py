#!/usr/bin/env python3
"""PEFT's everyday LoRA options between loom and PEFT, both ways, on a small random Qwen3 (its own
head) and Gemma 3 (its head tied to the embedding): use_rslora, target_modules "all-linear",
rank_pattern and alpha_pattern, alone and together, and modules_to_save (Qwen3's lm_head; Gemma 3's
embed_tokens, the tie kept: PEFT's ensure_weight_tying).

- PEFT writes it: get_peft_model with a LoraConfig of the option, lora_B (and the saved modules'
  copies) moved at random so that the adapter moves the logits, save_pretrained; loom reads its run file's lora block (the same option
  under loom's key), job.load_adapter() the folder, and gives PEFT's logits within 1e-5 of the largest.
- loom writes it: loom fine-tunes with the option for a few steps and saves the adapter; its
  adapter_config.json carries the option, and PeftModel.from_pretrained (warnings as errors) gives
  loom's logits within 1e-5, its layers of the ranks the option says. loom then merges and saves the
  model (save_pretrained): AutoModelForCausalLM.from_pretrained gives the merged model's logits, and
  they are the unmerged ones, within 1e-5.

At 1 rank under local(), and at 2 under fsdp().

    peft_options_vs_peft.py --loom-run L --program P --ranks N
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

from loom_runs import driver_arguments

TOLERANCE = 1e-5

# name: (the run file's lora block, PEFT's LoraConfig arguments): the same adapter in both spellings.
OPTIONS = {
    "rslora": ({"rank": 4, "alpha": 8, "targets": ["q_proj", "v_proj"], "use_rslora": True},
               dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], use_rslora=True)),
    "all-linear": ({"rank": 2, "alpha": 4, "targets": "all-linear"},
                   dict(r=2, lora_alpha=4, target_modules="all-linear")),
    "patterns": ({"rank": 4, "alpha": 8, "targets": ["q_proj", "v_proj", "down_proj"],
                  "rank_pattern": {"v_proj": 2, r"layers\.1\.mlp\.down_proj": 6},
                  "alpha_pattern": {"q_proj": 3, "down_proj": 16}},
                 dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                      rank_pattern={"v_proj": 2, r"layers\.1\.mlp\.down_proj": 6},
                      alpha_pattern={"q_proj": 3, "down_proj": 16})),
    "all-together": ({"rank": 4, "alpha": 6, "targets": "all-linear", "use_rslora": True,
                      "rank_pattern": {"o_proj": 2}, "alpha_pattern": {"gate_proj": 2}},
                     dict(r=4, lora_alpha=6, target_modules="all-linear", use_rslora=True,
                          rank_pattern={"o_proj": 2}, alpha_pattern={"gate_proj": 2})),
}
# The module each family saves whole: a head of its own, or the embedding a tied head reads.
MODULE_TO_SAVE = {"qwen3": "lm_head", "gemma3": "embed_tokens"}
FAMILIES = {
    "qwen3": ("Qwen3Config", dict(head_dim=12, tie_word_embeddings=False)),
    "gemma3": ("Gemma3TextConfig", dict(head_dim=12, sliding_window=6, sliding_window_pattern=2,
                                        query_pre_attn_scalar=12)),
}


def make_checkpoint(folder: Path, family: str) -> Path:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    config_class, extra = FAMILIES[family]
    torch.manual_seed(5)
    config = getattr(transformers, config_class)(vocab_size=64, hidden_size=32, intermediate_size=48,
                                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                 max_position_embeddings=64, rms_norm_eps=1e-5, **extra)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
    out = folder / family
    model.save_pretrained(out)
    return out


def run_file(path: Path, checkpoint: Path, strategy: str, lora: dict) -> Path:
    path.write_text(json.dumps({"plan": [{"seeded": 0}, {"pretrained": str(checkpoint)}, {"lora": lora},
                                         {"strategy": strategy}]}))
    return path


def largest_difference(a, b) -> float:
    return (a - b).abs().max().item()


def main() -> int:
    args = driver_arguments()
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    strategy = "local" if args.ranks == 1 else "fsdp"
    failures: list[str] = []

    def loom(*words: str) -> str | None:
        """The run's output, or None when it failed."""
        command = [args.loom_run, "--nproc-per-node", str(args.ranks), "--", args.program, *words]
        print("$", " ".join(command), flush=True)
        done = subprocess.run(command, timeout=120, capture_output=True, text=True)
        print(done.stdout, done.stderr, end="", flush=True)
        return done.stdout if done.returncode == 0 else None

    with tempfile.TemporaryDirectory(prefix="loom-peft-options-") as scratch:
        root = Path(scratch)
        for family in FAMILIES:
            checkpoint = make_checkpoint(root, family)
            ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(3))
            module = MODULE_TO_SAVE[family]
            saving = ({"rank": 4, "alpha": 8, "targets": ["q_proj", "v_proj"], "modules_to_save": [module]},
                      dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], modules_to_save=[module],
                           ensure_weight_tying=family == "gemma3"))
            for name, (block, peft_arguments) in {**OPTIONS, "modules-to-save": saving}.items():
                case = root / family / name
                case.mkdir(parents=True)
                what = f"{family} {name}"
                config = run_file(case / "run.json", checkpoint, strategy, block)

                # PEFT writes it, loom reads it.
                torch.manual_seed(11)
                base = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
                peft_model = get_peft_model(base, LoraConfig(**peft_arguments)).eval()
                with torch.no_grad():
                    for parameter_name, parameter in peft_model.named_parameters():
                        if "lora_B" in parameter_name:
                            parameter.normal_(0.0, 0.5)
                        elif "modules_to_save" in parameter_name:
                            parameter.add_(torch.randn_like(parameter), alpha=0.5)
                    theirs = peft_model(ids).logits
                peft_model.save_pretrained(case / "from-peft")
                save_file({"ids": ids}, str(case / "ids.safetensors"))
                if loom(str(config), "load", str(case / "from-peft"), str(case / "ids.safetensors"),
                        str(case / "loom-logits.safetensors")) is None:
                    failures.append(f"{what}: loom could not load PEFT's adapter")
                else:
                    ours = load_file(str(case / "loom-logits.safetensors"))["logits"]
                    difference = largest_difference(ours, theirs)
                    allowed = TOLERANCE * theirs.abs().max().item()
                    print(f"{what}: PEFT's adapter in loom, largest difference {difference:.2e}: "
                          f"{'within' if difference <= allowed else 'BEYOND'} {allowed:.2e}", flush=True)
                    if difference > allowed:
                        failures.append(f"{what}: PEFT's adapter gives other logits in loom")

                # loom writes it, PEFT reads it.
                trained = case / "from-loom"
                printed = loom(str(config), "train", str(trained))
                if printed is None:
                    failures.append(f"{what}: loom could not train")
                    continue
                # Under fsdp() the saved module is sharded like the base: its shard's gradient is
                # reduce-scattered in the step's schedule.
                saved_parameter = "model.embed_tokens.weight" if module == "embed_tokens" else f"{module}.weight"
                if ("modules_to_save" in block and strategy == "fsdp" and
                        not re.search(rf"reduce_scatter backward world \d+ B \[[^]]*{re.escape(saved_parameter)}",
                                      printed)):
                    failures.append(f"{what}: the schedule reduce-scatters no shard of {saved_parameter}")
                written = json.loads((trained / "adapter" / "adapter_config.json").read_text())
                for key in ("use_rslora", "rank_pattern", "alpha_pattern", "modules_to_save"):
                    expected = block.get(key, {} if key.endswith("pattern") else None if key == "modules_to_save" else False)
                    if written.get(key) != expected:
                        failures.append(f"{what}: adapter_config.json has {key} {written.get(key)!r}, not {expected!r}")
                expected = load_file(str(trained / "logits.safetensors"))
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing. is deprecated",
                                            category=FutureWarning)
                    base = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
                    adapted = PeftModel.from_pretrained(base, trained / "adapter").eval()
                with torch.no_grad():
                    reproduced = adapted(expected["ids"]).logits
                difference = largest_difference(reproduced, expected["logits"])
                allowed = TOLERANCE * expected["logits"].abs().max().item()
                print(f"{what}: loom's adapter in PEFT, largest difference {difference:.2e}: "
                      f"{'within' if difference <= allowed else 'BEYOND'} {allowed:.2e}", flush=True)
                if difference > allowed:
                    failures.append(f"{what}: PEFT gives other logits from loom's adapter")
                merged_logits = load_file(str(trained / "merged-logits.safetensors"))["logits"]
                with torch.no_grad():
                    from_merged = AutoModelForCausalLM.from_pretrained(trained / "merged").eval()(expected["ids"]).logits
                for label, a, b in (("transformers on loom's merged model", from_merged, merged_logits),
                                    ("loom's merged model against its unmerged one", merged_logits, expected["logits"])):
                    difference = largest_difference(a, b)
                    print(f"{what}: {label}, largest difference {difference:.2e}: "
                          f"{'within' if difference <= allowed else 'BEYOND'} {allowed:.2e}", flush=True)
                    if difference > allowed:
                        failures.append(f"{what}: {label}")
                if "modules_to_save" in block:
                    saved = load_file(str(trained / "adapter" / "adapter_model.safetensors"))
                    key = f"base_model.model.{'model.embed_tokens' if module == 'embed_tokens' else module}.weight"
                    original = load_file(str(checkpoint / "model.safetensors"))[key.removeprefix("base_model.model.")]
                    moved = (saved[key] - original).abs().max().item()
                    if moved == 0:
                        failures.append(f"{what}: the saved {module} did not train")
                ranks = {n.removeprefix("base_model.model.").removesuffix(".lora_A.weight"): t.shape[0]
                         for n, t in load_file(str(trained / "adapter" / "adapter_model.safetensors")).items()
                         if n.endswith("lora_A.weight")}
                peft_ranks = {n.removeprefix("base_model.model."): m.r["default"] for n, m in adapted.named_modules()
                              if hasattr(m, "r") and isinstance(m.r, dict) and "default" in m.r}
                if ranks != peft_ranks:
                    failures.append(f"{what}: loom's layers and ranks {ranks} are not PEFT's {peft_ranks}")
    if failures:
        print("FAILED: " + "; ".join(failures))
        return 1
    print(f"PEFT's options round-trip between loom and PEFT on {len(FAMILIES)} families, {len(OPTIONS) + 1} option sets, "
          f"at {args.ranks} rank(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
