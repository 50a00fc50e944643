#!/usr/bin/env python3
"""loom::models::generate against transformers' generate, token for token, on small random
checkpoints made as causal_lm_vs_transformers.py makes them: Llama with grouped-query attention,
Mistral in a window of 7, Qwen2 with a window of 5 on its last layers, Qwen3, and Gemma 3 with local
layers in a window of 6, sharded (each window shorter than the 8 prompt tokens and 24 new ones, so
that every window matters). Gemma 3's head is untied here: tied, these random weights repeat the
last token forever, which a broken cache could do as well.

For each, transformers writes (expected-generate.safetensors, beside the checkpoint):
- greedy: model.generate(prompts, do_sample=False, max_new_tokens=24) with no end token;
- eos: the same with an end token the second sequence first makes a few tokens in, and pad 0, so
  that one sequence stops and is padded while the other goes on (or stops later);
- sampled: do_sample=True, temperature 0.8, top_k 50, top_p 0.9 after torch.manual_seed(11);
- lora (Llama and Gemma 3): PEFT's model with a LoRA adapter of random B (init_lora_weights=False,
  r 4, alpha 8, on q_proj, v_proj and down_proj), greedy, and the adapter beside it; its tokens must
  differ from the base model's, so that an adapter left out would fail.

Then generate-parity runs under loom-run (local() at 1 rank; ddp() and fsdp() at 2, the model called
inside job.with_whole_module), and every rank must give the same tokens: with the kv_cache and
without it (use_cache = false), and with the adapter loaded by job.load_adapter under lora(...).

    generate_vs_transformers.py --loom-run L --program P --ranks N
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from causal_lm_vs_transformers import CONFIGS, make
from loom_runs import LoomRuns, driver_arguments, strategies

GEMMA3 = CONFIGS["gemma3-sharded"]
CHECKPOINTS = {name: CONFIGS[name] for name in ("llama-gqa-untied", "mistral-window", "qwen2-window-tied",
                                                "qwen3-untied")} | {
    "gemma3-untied-sharded": (GEMMA3[0], GEMMA3[1] | dict(tie_word_embeddings=False), *GEMMA3[2:])}
LORA_CHECKPOINTS = ("llama-gqa-untied", "gemma3-untied-sharded")
NEW_TOKENS = 24
SAMPLING = dict(do_sample=True, temperature=0.8, top_k=50, top_p=0.9)  # generate_parity.cpp's
SAMPLING_SEED = 11


def expect(checkpoint: Path) -> list[str]:
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    model.generation_config.eos_token_id = None  # every sequence NEW_TOKENS long
    model.generation_config.pad_token_id = None
    prompts = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(prompts)  # else a prompt token equal to pad_token_id would be masked

    def generate(m, **options):
        with torch.no_grad():
            return m.generate(prompts, attention_mask=mask, max_new_tokens=NEW_TOKENS, **options)

    expected = {"prompts": prompts, "greedy": generate(model, do_sample=False)}
    second = expected["greedy"][1, prompts.shape[1]:].tolist()
    eos = next((token for i, token in enumerate(second) if i >= 3 and token not in second[:i]), second[-1])
    expected["eos_token_id"] = torch.tensor([eos])
    expected["eos"] = generate(model, do_sample=False, eos_token_id=eos, pad_token_id=0)
    torch.manual_seed(SAMPLING_SEED)
    expected["sampled"] = generate(model, **SAMPLING)
    failures = []
    if checkpoint.name in LORA_CHECKPOINTS:
        torch.manual_seed(0)
        adapted = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                                   init_lora_weights=False)).eval()
        adapted.save_pretrained(checkpoint / "adapter")
        expected["lora"] = generate(adapted, do_sample=False)
        if torch.equal(expected["lora"], expected["greedy"]):
            failures.append(f"{checkpoint.name}: the adapter leaves the greedy tokens as they were")
    save_file({name: tensor.contiguous() for name, tensor in expected.items()},
              str(checkpoint / "expected-generate.safetensors"))
    print(f"{checkpoint.name}: transformers' greedy tokens {expected['greedy'][:, prompts.shape[1]:].tolist()}; "
          f"with end token {eos} the second sequence stops after {second.index(eos) + 1} and the batch after "
          f"{expected['eos'].shape[1] - prompts.shape[1]}", flush=True)
    return failures


def main() -> None:
    args = driver_arguments()
    with tempfile.TemporaryDirectory(prefix="loom-generate-") as scratch:
        folder = Path(scratch)
        make(folder, CHECKPOINTS)
        loom = LoomRuns(args)
        failures = loom.failures
        for name in CHECKPOINTS:
            failures += expect(folder / name)
            for strategy in strategies(args.ranks):
                loom(folder / name, strategy)
                if name in LORA_CHECKPOINTS:
                    loom(folder / name, strategy, "--lora", str(folder / name / "adapter"))
        if failures:
            sys.exit("FAILED: " + "; ".join(failures))
    print(f"loom's generate gives transformers' tokens (greedy, with the cache and without, an end token, sampled with "
          f"a seed, and LoRA-adapted) on {len(CHECKPOINTS)} checkpoints at {args.ranks} rank(s)")


if __name__ == "__main__":
    main()
