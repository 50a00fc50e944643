#!/usr/bin/env python3
"""loom::models::CausalLM against transformers' own models of each family it reads (Llama, Mistral,
Qwen2, Qwen3, Gemma 3), on checkpoints nobody here wrote: small random models made with
save_pretrained (no hub), in several configurations per family, and their logits for fixed token ids.
loom loads each checkpoint by name (pretrained(...): under fsdp() each rank reads only the rows of
its shards, about 1/N of the bytes, which the driver checks) and must give the same logits within
1e-5 of their largest magnitude (fp32), under local() on one rank and under ddp() and fsdp() on 2
and 3; under mixed_precision() (bf16) their rms difference from transformers' fp32 logits at most
twice that of transformers' own model computing in bf16.

Then the way back: loom fine-tunes LoRA on q_proj, v_proj and down_proj under each strategy (fp32 and
bf16), and PEFT must reproduce its logits from the adapter it saved
(PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(checkpoint), adapter), warnings as
errors), and transformers from the merged weights (AutoModelForCausalLM.from_pretrained(merged)).

    causal_lm_vs_transformers.py --loom-run L --program P --ranks N      (the driver)
    causal_lm_vs_transformers.py make FOLDER                              (the checkpoints alone)

The configurations: Llama with grouped-query attention and an untied head, multi-head with a tied
head, llama3 rope scaling with attention and MLP biases and a head_dim of its own, and one sharded
over several files with an index; Mistral in a sliding window shorter than the ids; Qwen2 untied,
and tied with a window on its last layers; Qwen3 with a head_dim of its own, untied, and tied with
attention biases; Gemma 3 with a local layer on each side of a global one, linear rope scaling on
the global layer, a query_pre_attn_scalar of its own and final logit soft-capping, sharded.
"""
from __future__ import annotations

import sys
import tempfile
import warnings
from pathlib import Path

from loom_runs import LoomRuns, driver_arguments, strategies

# name: (transformers' config class, its settings beyond the shared sizes, max_shard_size).
CONFIGS = {
    "llama-gqa-untied": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)),
    "llama-mha-tied": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True)),
    "llama3-bias": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=1, head_dim=12, attention_bias=True,
                                        mlp_bias=True,
                                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 16})),
    "llama-sharded": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),
                      "20KB"),
    "mistral-window": ("MistralConfig", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=10,
                                             sliding_window=7)),
    "qwen2-untied": ("Qwen2Config", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)),
    "qwen2-window-tied": ("Qwen2Config", dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True,
                                              use_sliding_window=True, sliding_window=5, max_window_layers=1)),
    "qwen3-untied": ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                                         tie_word_embeddings=False)),
    "qwen3-bias-tied": ("Qwen3Config", dict(num_attention_heads=2, num_key_value_heads=2, head_dim=6,
                                            attention_bias=True, tie_word_embeddings=True)),
    "gemma3-sharded": ("Gemma3TextConfig", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                                                sliding_window=6, sliding_window_pattern=2, query_pre_attn_scalar=20,
                                                final_logit_softcapping=4.0,
                                                rope_scaling={"rope_type": "linear", "factor": 4.0},
                                                rope_theta=1000.0, rope_local_base_freq=50.0), "20KB"),
}
# What loom fine-tunes with LoRA: a head of its own, and one tied to the embedding, in each family.
LORA_CONFIGS = ("llama-gqa-untied", "llama-mha-tied", "mistral-window", "qwen2-window-tied", "qwen3-untied",
                "gemma3-sharded")
FP32_TOLERANCE = 1e-5
BF16_MARGIN = 2  # causal_lm_parity.cpp's: bf16 logits' rms error at most this many times transformers' own in bf16


def make(folder: Path, configs: dict = CONFIGS) -> None:
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    for index, (name, (config_class, extra, *shard)) in enumerate(configs.items()):
        torch.manual_seed(100 + index)
        config = getattr(transformers, config_class)(vocab_size=96, hidden_size=32, intermediate_size=56,
                                                     num_hidden_layers=3, max_position_embeddings=64,
                                                     rms_norm_eps=1e-5, **({"rope_theta": 500.0} | extra))
        model = AutoModelForCausalLM.from_config(config).eval()
        with torch.no_grad():  # larger than the default init, so that every layer moves the logits
            for parameter in model.parameters():
                parameter.normal_(0.0, 0.2)
            for module in model.modules():
                if type(module).__name__.endswith("RMSNorm"):  # Gemma's weigh by (1 + w)
                    module.weight.uniform_(-0.5, 0.5) if "Gemma" in type(module).__name__ else \
                        module.weight.uniform_(0.5, 1.5)
        out = folder / name
        model.save_pretrained(out, max_shard_size=shard[0] if shard else "5GB")
        ids = torch.randint(0, config.vocab_size, (3, 24), generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            logits = model(ids).logits
            logits_bf16 = model.to(torch.bfloat16)(ids).logits.float()
        save_file({"ids": ids, "logits": logits.contiguous(), "logits_bf16": logits_bf16.contiguous()},
                  str(out / "expected.safetensors"))
        if shard and not (out / "model.safetensors.index.json").exists():
            sys.exit(f"FAILED: the checkpoint {name} has no index")


def reproduced(checkpoint: Path, out: Path, bf16: bool) -> list[str]:
    """What PEFT and transformers give from loom's adapter and merged weights, against loom's logits:
    in fp32 within 1e-5 of the largest; loom's bf16 logits against the fp32 ones of the model loaded,
    their rms difference at most BF16_MARGIN times that model's own computing in bf16."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    expected = load_file(str(out / "logits.safetensors"))
    ids, theirs = expected["ids"], expected["logits"]
    scale = theirs.abs().max().item()
    failures = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a key PEFT or transformers does not use, or misses, is a failure
        # PEFT 0.21 reads an attribute transformers 5 has deprecated: theirs, not about the files.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing. is deprecated", category=FutureWarning)
        base = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
        with torch.no_grad():
            moved = (base(ids).logits - theirs).abs().max().item()
        adapted = PeftModel.from_pretrained(base, out / "adapter").eval()
        merged = AutoModelForCausalLM.from_pretrained(out / "merged").eval()
    if moved <= 1e-2 * scale:  # else an adapter that did nothing would pass
        failures.append(f"{out.name}: the fine-tuned logits are within {moved:.2e} of the base model's")
    for what, model in (("PEFT with loom's adapter", adapted), ("transformers with loom's merged weights", merged)):
        with torch.no_grad():
            reference = model(ids).logits
            if bf16:  # root mean squares, as causal_lm_parity.cpp compares bf16
                difference = (reference - theirs).square().mean().sqrt().item()
                own = model.to(torch.bfloat16)(ids).logits.float()
                allowed = BF16_MARGIN * (own - reference).square().mean().sqrt().item()
            else:
                difference = (reference - theirs).abs().max().item()
                allowed = FP32_TOLERANCE * scale
        within = difference <= allowed
        print(f"{out.name}: {what}: {'rms' if bf16 else 'largest'} difference {difference:.2e} (largest logit "
              f"{scale:.2e}): {'within' if within else 'BEYOND'} {allowed:.2e}", flush=True)
        if not within:
            failures.append(f"{out.name}: {what}")
    return failures


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(Path(sys.argv[2]))
        return
    args = driver_arguments()
    with tempfile.TemporaryDirectory(prefix="loom-causal-lm-") as scratch:
        folder = Path(scratch)
        make(folder)
        loom = LoomRuns(args)
        failures = loom.failures
        for name in CONFIGS:
            for strategy in strategies(args.ranks):
                loom(folder / name, strategy)
                loom(folder / name, strategy, "--bf16")
        for name in LORA_CONFIGS:
            for strategy in strategies(args.ranks):
                for precision in ((), ("--bf16",)):
                    out = folder / "trained" / f"{name}-{strategy}{'-bf16' if precision else ''}"
                    if loom(folder / name, strategy, *precision, "--lora", str(out)):
                        failures += reproduced(folder / name, out, bool(precision))
        if failures:
            sys.exit("FAILED: " + "; ".join(failures))
    print(f"loom's CausalLM gives transformers' logits for {len(CONFIGS)} checkpoints at {args.ranks} rank(s), in fp32 "
          f"and bf16, and PEFT and transformers reproduce what loom fine-tuned with LoRA on {len(LORA_CONFIGS)}")


if __name__ == "__main__":
    main()
