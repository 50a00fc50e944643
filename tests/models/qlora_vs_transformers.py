#!/usr/bin/env python3
"""QLoRA in loom against the Python stack it replaces: transformers loading a bf16 checkpoint with
bitsandbytes' 4-bit NormalFloat (BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16), on the CPU) and PEFT's LoRA on
it, on small random Llama and Qwen3 checkpoints saved by transformers in bf16. loom builds what the
benchmark builds: default_dtype(bf16) | pretrained | quantized(nf4) | lora | mixed_precision(bf16)
(qlora_parity.cpp), under local() at 1 rank, and fsdp(), ddp() and hybrid sharding
(fsdp({.shard_group_size = 1})) at 2.

What is close enough is measured on the Python stack itself: its own bf16 error is the root mean
square of its difference from the same model computing in fp32 with the weights bitsandbytes
dequantizes (bitsandbytes.functional.dequantize_4bit into an fp32 copy of the model, PEFT's adapters
on it alike), and loom must be within BF16_MARGIN times that (rms: the largest of a few thousand bf16
rounding errors is one sample of a wide tail, as causal_lm_parity.cpp says):

- the logits of fixed ids, of the quantized base (lora_B still zero) and with PEFT's initial adapter
  (get_peft_model on the bnb model, lora_B drawn at random, save_pretrained), which loom loads with
  job.load_adapter: loom's rms difference from the fp32 logits against bnb's;
- STEPS plain SGD steps from that adapter on the same batches (at 2 ranks each rank on half of each
  batch's rows: the mean of the ranks' losses is the batch's): loom's losses against the fp32 run's,
  their rms over the steps, against PEFT-on-bnb's;
- Files: the adapter loom saves after training (PEFT's folder) loaded by PeftModel.from_pretrained onto
  transformers' bnb model gives loom's trained logits (their rms difference against that model's own
  error with the adapter); and loom's merged save (job.merge(), job.save_pretrained: the base
  dequantized with the update added, a plain model with no quantization_config) loaded by
  AutoModelForCausalLM.from_pretrained gives them too. The trained logits differ from the initial
  ones by more than the bound, so that an adapter that did not train or did not load would fail.

Measured (2 cores, loom's bf16 products through the fp32 GEMM): the Python stack's own errors are
about 1.0e-2 for the logits (rms, logits of about 1) and 1.1e-3 to 1.5e-3 for the losses (rms over the
steps, losses of about 4.5); loom's: the base logits equal bnb's (the same bytes, the same
dequantization: 9.99e-3 and 1.04e-2, as bnb's own), 1.0e-2 to 1.2e-2 with the initial adapter,
1.0e-3 to 1.4e-3 for the losses, 1.0e-2 to 1.2e-2 for loom's adapter in PEFT, 1.27e-2 to 1.34e-2 for
the merged save in transformers (bf16, one more rounding of W + BA); the merged job gives the unmerged
logits exactly. Without quantized(nf4) in the plan loom is 0.21 to 0.25 away on the logits and 3e-2 on
the losses: ten to twenty times the bound.

bitsandbytes 0.50.2 repacks a Linear4bit's weight for its AVX512-BF16 CPU kernel in inference
(absmax rounded to bf16, inner sizes whole blocks only); the driver turns that off
(support_avx512bf16_for_cpu = False), so that bnb computes as on a GPU: dequantize_4bit in bf16, then
the product, on any CPU.

    qlora_vs_transformers.py --loom-run L --program P --ranks N
"""
from __future__ import annotations

import copy
import json
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from loom_runs import driver_arguments

BF16_MARGIN = 2
STEPS = 10
LR = 0.2
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # qlora_parity.cpp's
RANK, ALPHA = 4, 8
# Whether loom's merged save is checked (job.merge() on a quantized base, then save_pretrained).
MERGED = True  # qlora_parity.cpp --merge

FAMILIES = {
    "llama": ("LlamaConfig", dict(tie_word_embeddings=False)),
    "qwen3": ("Qwen3Config", dict(head_dim=16, tie_word_embeddings=False)),
}


def make_checkpoint(folder: Path, family: str) -> Path:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    config_class, extra = FAMILIES[family]
    torch.manual_seed(5)
    config = getattr(transformers, config_class)(vocab_size=64, hidden_size=64, intermediate_size=128,
                                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                 max_position_embeddings=64, rms_norm_eps=1e-5, **extra)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
            else:
                parameter.normal_(0.0, 0.1)
    out = folder / family
    model.to(torch.bfloat16).save_pretrained(out)
    return out


def bnb_model(checkpoint: Path):
    """transformers' model of `checkpoint` in bitsandbytes' nf4 with double quantization, on the CPU."""
    import bitsandbytes as bnb
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                      bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, quantization_config=quantization, device_map="cpu")
    layers = 0
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False  # bnb's GPU arithmetic on every CPU (the docstring)
            layers += 1
    assert layers == 7 * model.config.num_hidden_layers, f"{layers} 4-bit layers"
    return model.eval()


def dequantized_fp32(checkpoint: Path, quantized):
    """The model of `checkpoint` in fp32 with each of `quantized`'s 4-bit weights as bitsandbytes
    dequantizes it, in fp32."""
    import bitsandbytes as bnb
    import torch
    from bitsandbytes.functional import dequantize_4bit
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, module in quantized.named_modules():
            if isinstance(module, bnb.nn.Linear4bit):
                state = copy.copy(module.weight.quant_state)
                state.dtype = torch.float32
                weight = dequantize_4bit(module.weight.data, state)
                assert torch.equal(weight.bfloat16(), dequantize_4bit(module.weight.data, module.weight.quant_state))
                modules[name.removeprefix("base_model.model.")].weight.copy_(weight)
    return model.eval()


def logits(model, ids):
    import torch

    with torch.no_grad():
        return model(ids).logits.float()


def sgd(model, batches) -> list[float]:
    import torch

    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all(p.dtype == torch.float32 for p in trainable)
    optimizer = torch.optim.SGD(trainable, lr=LR)
    losses = []
    for batch in batches:
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    model.eval()
    return losses


def rms(a, b) -> float:
    return (a - b).square().mean().sqrt().item()


def reference(checkpoint: Path) -> dict:
    """The Python stack's run on `checkpoint`: PEFT's initial adapter into checkpoint/initial-adapter and
    the inputs into checkpoint/inputs.safetensors; the bnb and the fp32-dequantized logits and losses."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 64, (2, 16), generator=generator)
    batches = torch.randint(0, 64, (STEPS, 4, 16), generator=generator)
    save_file({"ids": ids, "batches": batches, "lr": torch.tensor([LR], dtype=torch.float64)},
              str(checkpoint / "inputs.safetensors"))

    quantized = bnb_model(checkpoint)
    fp32 = dequantized_fp32(checkpoint, quantized)
    found = {"base": logits(quantized, ids), "base_fp32": logits(fp32, ids)}

    torch.manual_seed(11)
    adapted = get_peft_model(quantized, LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS, lora_dropout=0.0))
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.1)
    adapted.save_pretrained(checkpoint / "initial-adapter")
    adapted_fp32 = PeftModel.from_pretrained(fp32, checkpoint / "initial-adapter", is_trainable=True)
    found["initial"], found["initial_fp32"] = logits(adapted, ids), logits(adapted_fp32, ids)
    # The same batches' losses with the initial adapter, for a run that trained nothing.
    with torch.no_grad():
        found["losses_untrained"] = torch.tensor([adapted_fp32(input_ids=b, labels=b).loss.item() for b in batches],
                                                 dtype=torch.float64)
    found["losses"] = torch.tensor(sgd(adapted, batches), dtype=torch.float64)
    found["losses_fp32"] = torch.tensor(sgd(adapted_fp32, batches), dtype=torch.float64)
    return found


class Checks:
    def __init__(self):
        self.failures: list[str] = []

    def within(self, what: str, difference: float, own: float) -> None:
        allowed = BF16_MARGIN * own
        ok = math.isfinite(difference) and difference <= allowed
        print(f"{what}: rms difference {difference:.3e}, the Python stack's own bf16 error {own:.3e}: "
              f"{'within' if ok else 'BEYOND'} {allowed:.3e}", flush=True)
        if not ok:
            self.failures.append(what)


def check_run(checkpoint: Path, out: Path, found: dict, ranks: int, checks: Checks, what: str) -> None:
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    ids = load_file(str(checkpoint / "inputs.safetensors"))["ids"]
    ours = {name: load_file(str(out / f"{name}-logits.safetensors"))["logits"] for name in ("base", "initial")}
    checks.within(f"{what}: base logits", rms(ours["base"], found["base_fp32"]), rms(found["base"], found["base_fp32"]))
    checks.within(f"{what}: logits with PEFT's initial adapter", rms(ours["initial"], found["initial_fp32"]),
                  rms(found["initial"], found["initial_fp32"]))

    losses = torch.stack([load_file(str(out / f"losses-{rank}.safetensors"))["losses"] for rank in range(ranks)]).mean(0)
    print(f"{what}: losses loom {[round(x, 5) for x in losses.tolist()]}\n"
          f"{' ' * len(what)}  PEFT bnb {[round(x, 5) for x in found['losses'].tolist()]}\n"
          f"{' ' * len(what)}  PEFT fp32 {[round(x, 5) for x in found['losses_fp32'].tolist()]}", flush=True)
    checks.within(f"{what}: {STEPS} SGD steps' losses", rms(losses, found["losses_fp32"]),
                  rms(found["losses"], found["losses_fp32"]))
    untrained = rms(found["losses_untrained"], found["losses_fp32"])
    print(f"{what}: training moved the losses by {untrained:.3e} (rms)", flush=True)
    if not untrained > 2 * BF16_MARGIN * rms(found["losses"], found["losses_fp32"]):
        checks.failures.append(f"{what}: training moved the losses too little to tell it from none")

    # Files: loom's adapter in PEFT on the bnb model (and on the fp32 one, for the bound).
    trained = load_file(str(out / "logits.safetensors"))["logits"]
    in_bnb = logits(PeftModel.from_pretrained(bnb_model(checkpoint), out / "adapter"), ids)
    fp32 = dequantized_fp32(checkpoint, bnb_model(checkpoint))
    in_fp32 = logits(PeftModel.from_pretrained(fp32, out / "adapter"), ids)
    own = rms(in_bnb, in_fp32)
    checks.within(f"{what}: loom's adapter in PEFT on transformers' bnb model against loom", rms(in_bnb, trained), own)
    moved = rms(trained, ours["initial"])
    print(f"{what}: training moved loom's logits by {moved:.3e} (rms)", flush=True)
    if not moved > BF16_MARGIN * own:
        checks.failures.append(f"{what}: training moved the logits by no more than the bound")

    if MERGED:
        merged = out / "merged"
        config = json.loads((merged / "config.json").read_text())
        if "quantization_config" in config:
            checks.failures.append(f"{what}: the merged save's config.json has a quantization_config")
        plain = AutoModelForCausalLM.from_pretrained(merged).eval()
        if any(not p.is_floating_point() for p in plain.parameters()):
            checks.failures.append(f"{what}: the merged model has parameters that are not floating point")
        checks.within(f"{what}: loom's merged save in transformers ({next(plain.parameters()).dtype}) against loom",
                      rms(logits(plain, ids), trained), own)
        merged_logits = load_file(str(out / "merged-logits.safetensors"))["logits"]
        checks.within(f"{what}: loom's merged job against loom unmerged", rms(merged_logits, trained), own)


def quantized_bytes(checkpoint: Path) -> int:
    """The bytes of the checkpoint's weights quantized(...) quantizes: every linear layer's but the head."""
    from safetensors import safe_open

    with safe_open(str(checkpoint / "model.safetensors"), "pt") as f:
        return sum(f.get_slice(name).get_shape()[0] * f.get_slice(name).get_shape()[1] * 2 for name in f.keys()
                   if any(f".{target}.weight" in name for target in TARGETS))


def run_loom(args, checks: Checks, checkpoint: Path, strategy: str, out: Path) -> bool:
    """qlora-parity on `checkpoint` under `strategy`; what a rank read of the checkpoint checked: under
    fsdp() its shards' rows of what is not quantized, and each quantized weight whole (a rank reads it
    whole to quantize it, build_steps.cpp's deferred_parts); under the others all of it."""
    command = [args.loom_run, "--nproc-per-node", str(args.ranks), "--", args.program, str(checkpoint), strategy,
               str(out), *(["--merge"] if MERGED else [])]
    print("$", " ".join(command), flush=True)
    done = subprocess.run(command, timeout=120, capture_output=True, text=True)
    print(done.stdout, done.stderr, end="", flush=True)
    what = f"{strategy} on {checkpoint.name}"
    if done.returncode != 0:
        checks.failures.append(f"{what}: loom failed")
        return False
    whole = quantized_bytes(checkpoint)
    reads = re.findall(r"(\d+) of their (\d+) bytes read on this rank", done.stdout)
    if not reads:
        checks.failures.append(f"{what}: no line of the bytes read")
    for read, total in reads:
        read, total = int(read), int(total)
        allowed = whole + (total - whole) / args.ranks * 1.25 if strategy == "fsdp" else total
        if not (0 < read <= allowed and (strategy == "fsdp" or read == total)):
            checks.failures.append(f"{what}: a rank read {read} of {total} bytes ({whole} quantized)")
    return True


def main() -> int:
    args = driver_arguments()
    checks = Checks()
    strategies = ["local"] if args.ranks == 1 else ["fsdp", "ddp", "hybrid"]
    with tempfile.TemporaryDirectory(prefix="loom-qlora-") as scratch:
        root = Path(scratch)
        for family in FAMILIES:
            checkpoint = make_checkpoint(root, family)
            found = reference(checkpoint)
            # Llama under every strategy; Qwen3 under the first.
            for strategy in strategies if family == "llama" else strategies[:1]:
                out = root / "runs" / f"{family}-{strategy}"
                if run_loom(args, checks, checkpoint, strategy, out):
                    check_run(checkpoint, out, found, args.ranks, checks, f"{family} {strategy}")
    if checks.failures:
        print("FAILED: " + "; ".join(checks.failures))
        return 1
    print(f"loom's QLoRA equals transformers + bitsandbytes + PEFT's within {BF16_MARGIN}x their own bf16 error, "
          f"at {args.ranks} rank(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
