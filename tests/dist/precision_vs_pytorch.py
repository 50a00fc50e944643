#!/usr/bin/env python3
"""loom's bf16 against PyTorch's, on the same TinyGpt, start and batches: fsdp() under
mixed_precision() against FSDP2's fully_shard(mp_policy=MixedPrecisionPolicy(param_dtype=bfloat16,
reduce_dtype=float32)) on each block and the root, ddp() under mixed_precision() against
DistributedDataParallel with the forward under torch.autocast("cpu", bfloat16); with --lora,
adapters (rank 4 on q, k, v and o_proj) over a frozen base held in bf16.

    precision_vs_pytorch.py --loom-run L --program P --python PY --ranks N --strategy fsdp|ddp [--lora]

The driver runs loom's side (P, tests/dist/precision_parity.cpp) under loom-run, then this file's
`reference` role under loom-run with PY (a Python that has torch) from the state loom started
from, then loom again from that state with a cast left out: precision=fp32 (no mixed precision:
gathered and computed in fp32, no autocast) and, under fsdp() on 2 or 3 ranks, precision=bf16-reduce
(gradients reduce-scattered in bf16). ddp() refuses a reduce dtype other than its fp32 gradients',
and one rank reduces nothing, so neither has a bf16-reduce run.

The measure, after STEPS AdamW steps: for each tensor PyTorch trains, max |loom - torch| / max |torch|,
the worst over the tensors; and each step's loss on each rank, |loom - torch| / |torch|. The frozen
base must come back unchanged. attn.k_proj.bias is left out: its exact gradient is zero (a bias on
the keys adds the same q.b to every score of a query, which softmax ignores), so what it receives is
rounding noise, which Adam (its step g/sqrt(v) is scale-free) turns into steps of +-lr: its value
records which noise it got, not how faithful the arithmetic was.

The tolerance is u/2 = 2^-9 = 1.95e-3, u = 2^-8 being bf16's unit roundoff (8-bit significand):
less than one rounding to bf16 of the tensor's largest element, in parameters and in losses. It
separates the two kinds of run by orders of magnitude:
- A run that does PyTorch's operations in PyTorch's dtypes differs from it in fp32 arithmetic only
  (LibTorch's AdamW updates its moments with mul_ and add_, torch.optim.AdamW with lerp_): a few
  fp32 ulps, 2^-24, 2^16 times finer than bf16's spacing, which in a few steps seldom moves a
  rounding of a master weight to bf16. Measured, every strategy, LoRA or not, 1 to 3 ranks:
  at most 2.4e-7, every loss equal.
- A run with a cast left out rounds every activation or every gradient differently from the first
  step, by up to u of each value, and Adam makes relative differences of the gradients relative
  differences of the steps. Measured after 4 steps: fp32, 0.16 to 0.58 (the most in LoRA's B,
  which starts at zero); bf16-reduce, 6.7e-3 (LoRA) and 1.1e-2 on 2 ranks (a sum of two bf16
  values is often exact in bf16), 0.15 to 0.25 on 3.
loom's runs use ATen's own bf16 product (LOOM_BF16_PRODUCTS=aten): on a CPU without bf16
instructions loom::linear otherwise takes it through the fp32 GEMM, whose sums run in another order,
so that a few roundings to bf16 go the other way from the first step (test-job [precision] checks
that product against ATen's, op by op; mixed-precision-* train with it). Longer runs blur the line: once one rounding to bf16 goes the other way, the difference spreads
through the next forward like a run with other roundings (the matched run, 2 ranks: 1.4e-3 after
12 steps, against bf16-reduce's 1.3e-2), hence STEPS = 4.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

STEPS = 4
TOLERANCE = 2.0**-9


# ------------------------------------------------------------------ reference (one rank, PyTorch)
def reference(arguments: dict[str, str]) -> None:
    import math

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from safetensors.torch import load_file, save_file
    from torch import nn

    lora = arguments["lora"] == "1"

    class Linear(nn.Linear):
        """nn.Linear, with loom::nn::Linear's LoRA branch when adapted (rank 4, alpha 4: scaling 1)."""

        def __init__(self, in_features: int, out_features: int, adapted: bool = False):
            super().__init__(in_features, out_features)
            if adapted:
                self.lora_A = nn.Parameter(torch.empty(4, in_features))
                self.lora_B = nn.Parameter(torch.empty(out_features, 4))

        def forward(self, x):
            out = F.linear(x, self.weight, self.bias)
            if hasattr(self, "lora_A"):
                out = out.add_(F.linear(F.linear(x, self.lora_A), self.lora_B))
            return out

    # ../shared/bench/torch_anchor.py's TinyGpt, the adapters on the projections themselves.
    class Attention(nn.Module):
        def __init__(self, d: int, heads: int):
            super().__init__()
            self.heads = heads
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = (Linear(d, d, lora) for _ in range(4))

        def forward(self, x):
            b, t, d = x.shape

            def split(y):
                return y.view(b, t, self.heads, d // self.heads).transpose(1, 2)

            q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            return self.o_proj((att @ v).transpose(1, 2).reshape(b, t, d))

    class Block(nn.Module):
        def __init__(self, d: int, heads: int):
            super().__init__()
            self.ln1 = nn.LayerNorm(d)
            self.attn = Attention(d, heads)
            self.ln2 = nn.LayerNorm(d)
            self.fc_in = Linear(d, 4 * d)
            self.fc_out = Linear(4 * d, d)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.fc_out(F.gelu(self.fc_in(self.ln2(x))))

    class TinyGpt(nn.Module):
        def __init__(self, vocab: int = 32, d: int = 32, layers: int = 2, heads: int = 2, ctx: int = 16):
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(ctx, d)
            self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
            self.ln_f = nn.LayerNorm(d)
            self.head = Linear(d, vocab)

        def forward(self, idx, targets):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = TinyGpt()
    initial = load_file(arguments["init"])
    if set(initial) != {name for name, _ in model.named_parameters()}:
        sys.exit(f"loom's initial state names {sorted(initial)}, not this model's parameters")
    for name, p in model.named_parameters():
        # In loom's dtype: under LoRA, the base as model.to(torch.bfloat16) leaves it, the adapters fp32.
        p.data = initial[name].clone()
        p.requires_grad_(not lora or "lora_" in name)
    if arguments["strategy"] == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        mesh = init_device_mesh("cpu", (world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        wrapped = fully_shard(model, mesh=mesh, mp_policy=policy)
    else:
        wrapped = nn.parallel.DistributedDataParallel(model)
    autocast = arguments["strategy"] == "ddp"
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, foreach=False)
    losses = []
    for step in range(int(arguments["steps"])):
        generator = torch.Generator().manual_seed(1000 * step + rank)
        ids = torch.randint(0, 32, (4, 16), generator=generator)
        targets = torch.randint(0, 32, (4, 16), generator=generator)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = wrapped(ids, targets)
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    final = {}
    for name, p in model.named_parameters():
        whole = p.full_tensor() if hasattr(p, "full_tensor") else p
        final[name] = whole.detach().clone().contiguous()
    final["loss"] = torch.tensor(losses, dtype=torch.float32)
    folder = Path(arguments["out"])
    folder.mkdir(parents=True, exist_ok=True)
    save_file(final, folder / f"rank-{rank}.safetensors")
    # Every rank has written its file; skip PyTorch's teardown, which once ended a rank in
    # std::terminate ("terminate called without an active exception") after all the work was done.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


# ------------------------------------------------------------------ driver
def run(command: list[str]) -> None:
    print("$", " ".join(command), flush=True)
    result = subprocess.run(command, timeout=120, env={**os.environ, "LOOM_BF16_PRODUCTS": "aten"})
    if result.returncode != 0:
        sys.exit(f"FAILED: exit code {result.returncode}")


def check_initial_dtypes(init: Path, lora: bool) -> None:
    """default_dtype(bf16) under LoRA holds the base in bf16 and the adapters in fp32; else all is fp32."""
    import torch
    from safetensors.torch import load_file

    for name, value in load_file(init).items():
        expected = torch.float32 if not lora or "lora_" in name else torch.bfloat16
        if value.dtype != expected:
            sys.exit(f"FAILED: loom's initial {name} is {value.dtype}, not {expected}")


def differences(loom: Path, torch_run: Path, ranks: int, lora: bool) -> tuple[float, str, float]:
    """The worst trained tensor's max |loom - torch| / max |torch| and its name, and the worst
    step's |loom - torch| / |torch| of the loss over the ranks."""
    from safetensors.torch import load_file

    expected = load_file(torch_run / "rank-0.safetensors")
    actual = load_file(loom / "rank-0.safetensors")
    worst, worst_name = 0.0, ""
    for name, value in expected.items():
        if name == "loss" or name.endswith("k_proj.bias"):
            continue
        difference = (actual[name].float() - value.float()).abs().max()
        if lora and "lora_" not in name:
            if difference != 0:
                sys.exit(f"FAILED: loom's frozen {name} moved")
            continue
        relative = float(difference / value.float().abs().max())
        if relative > worst:
            worst, worst_name = relative, name
    loss = 0.0
    for rank in range(ranks):
        a = load_file(loom / f"rank-{rank}.safetensors")["loss"]
        b = load_file(torch_run / f"rank-{rank}.safetensors")["loss"]
        loss = max(loss, float(((a - b).abs() / b.abs()).max()))
    return worst, worst_name, loss


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "reference":
        reference(dict(item.split("=", 1) for item in sys.argv[2:]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loom-run", required=True)
    parser.add_argument("--program", required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--strategy", choices=("fsdp", "ddp"), required=True)
    parser.add_argument("--lora", action="store_true")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loom-precision-vs-pytorch-") as folder:
        out = Path(folder)
        common = {"strategy": options.strategy, "lora": "1" if options.lora else "0", "steps": str(STEPS)}
        launch = [options.loom_run, "--nproc-per-node", str(options.ranks), "--"]

        def loom(precision: str, *extra: str) -> Path:
            settings = {**common, "precision": precision, "out": str(out / f"loom-{precision}")}
            run(launch + [options.program] + [f"{k}={v}" for k, v in settings.items()] + list(extra))
            return out / f"loom-{precision}"

        matched = loom("bf16")
        init = matched / "init.safetensors"
        check_initial_dtypes(init, options.lora)
        reference_settings = {**common, "init": str(init), "out": str(out / "torch")}
        run(launch + [options.python, os.path.abspath(__file__), "reference"] +
            [f"{k}={v}" for k, v in reference_settings.items()])
        controls = ["fp32"] + (["bf16-reduce"] if options.strategy == "fsdp" and options.ranks > 1 else [])
        runs = {"bf16": matched, **{precision: loom(precision, f"init={init}") for precision in controls}}
        failures = []
        for precision, folder_of_run in runs.items():
            worst, name, loss = differences(folder_of_run, out / "torch", options.ranks, options.lora)
            within = worst <= TOLERANCE and loss <= TOLERANCE
            print(f"loom {precision} against PyTorch's bf16: parameters {worst:.2e} ({name}), losses {loss:.2e}: "
                  f"{'within' if within else 'beyond'} {TOLERANCE:.2e}")
            if precision == "bf16" and not within:
                failures.append("loom's bf16 differs from PyTorch's")
            if precision != "bf16" and within:
                failures.append(f"loom {precision} is within the tolerance: it cannot tell a cast left out")
    if failures:
        sys.exit("FAILED: " + "; ".join(failures))
    print(f"loom's bf16 equals PyTorch's within {TOLERANCE:.2e}; each run with a cast left out is beyond it")


if __name__ == "__main__":
    main()
