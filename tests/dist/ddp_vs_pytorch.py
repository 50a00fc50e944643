#!/usr/bin/env python3
"""loom's ddp({.find_unused_parameters = true}) against PyTorch's
DistributedDataParallel(find_unused_parameters=True), on the same model, start and data.

    ddp_vs_pytorch.py --loom-run L --program P --python PY --ranks N --mode full|lora

The driver runs loom's side (P, tests/dist/unused_parity.cpp) under loom-run, then this file's
`reference` role under loom-run with PY (a Python that has torch), starting from the parameters
loom drew, and compares every rank's final parameters. The blocks skip their gate on a pattern of
(step, rank) pairs that changes from step to step, differs between ranks, and leaves one gate
unused on every rank in one step (AdamW then leaves it alone, as PyTorch does: no gradient is not
a zero gradient).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SETTINGS = {"steps": "6", "width": "8", "depth": "3", "rows": "4", "lr": "0.01"}


def skips(ranks: int) -> str:
    last = ranks - 1
    pattern = [
        (1, "1", 1),      # one rank, one block
        (2, "*", 2),      # every rank: no gradient anywhere, the optimizer must skip it
        (3, "0", 0),      # two ranks skip different blocks in the same step
        (3, str(last), 2),
        (5, str(last), 1),
    ]
    return ",".join(f"{step}:{rank}:{block}" for step, rank, block in pattern)


# ------------------------------------------------------------------ reference (one rank, PyTorch)
def reference(arguments: dict[str, str]) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    width, depth, rows = int(arguments["width"]), int(arguments["depth"]), int(arguments["rows"])
    lora = arguments["mode"] == "lora"

    class Linear(nn.Linear):
        """nn.Linear, with loom::nn::Linear's LoRA branch when adapted (rank 4, alpha 4)."""

        def __init__(self, adapted: bool):
            super().__init__(width, width)
            if adapted:
                self.lora_A = nn.Parameter(torch.empty(4, width))
                self.lora_B = nn.Parameter(torch.empty(width, 4))

        def forward(self, x):
            out = F.linear(x, self.weight, self.bias)
            if hasattr(self, "lora_A"):
                out = out.add_(F.linear(F.linear(x, self.lora_A), self.lora_B), alpha=1.0)
            return out

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.gate, self.down = Linear(lora), Linear(lora), Linear(False)

        def forward(self, h, use_gate: bool):
            inner = F.silu(self.gate(h)) * self.up(h) if use_gate else self.up(h)
            return h + self.down(inner)

    class GatedStack(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(depth))

        def forward(self, h, use_gate):
            for block, used in zip(self.blocks, use_gate):
                h = block(h, used)
            return h

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = GatedStack()
    init = Path(arguments["out"]) / "init"
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(np.fromfile(init / f"{name}.f32", dtype=np.float32)).view_as(p))
            p.requires_grad_(not lora or "lora_" in name)
    ddp = DistributedDataParallel(model, find_unused_parameters=True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=float(arguments["lr"]))
    skip_list = [item.split(":") for item in arguments["skips"].split(",")]
    for step in range(int(arguments["steps"])):
        generator = torch.Generator().manual_seed(100 + step)
        x = torch.randn(rows * world, width, generator=generator)[rank * rows:(rank + 1) * rows]
        y = torch.randn(rows * world, width, generator=generator)[rank * rows:(rank + 1) * rows]
        use_gate = [True] * depth
        for s, r, b in skip_list:
            if int(s) == step and r in ("*", str(rank)):
                use_gate[int(b)] = False
        F.mse_loss(ddp(x, use_gate), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    folder = Path(arguments["out"]) / "torch" / f"rank{rank}"
    folder.mkdir(parents=True, exist_ok=True)
    for name, p in model.named_parameters():
        p.detach().numpy().tofile(folder / f"{name}.f32")
    # Every rank has written its files; skip PyTorch's teardown, which once ended a rank in
    # std::terminate ("terminate called without an active exception") after all the work was done.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


# ------------------------------------------------------------------ driver
def run(command: list[str]) -> None:
    print("$", " ".join(command), flush=True)
    result = subprocess.run(command, timeout=120)
    if result.returncode != 0:
        sys.exit(f"FAILED: exit code {result.returncode}")


def compare(out: Path, ranks: int) -> int:
    import numpy as np

    expected_folder = out / "torch" / "rank0"
    names = sorted(path.name for path in expected_folder.iterdir())
    failures = 0
    for rank in range(ranks):
        for side in ("torch", "loom"):
            for name in names:
                expected = np.fromfile(expected_folder / name, dtype=np.float32)
                actual = np.fromfile(out / side / f"rank{rank}" / name, dtype=np.float32)
                difference = float(np.max(np.abs(actual - expected)))
                if difference > 1e-6:
                    print(f"DIFFERS: {side} rank {rank} {name[:-4]}: max |difference| {difference:.3g}")
                    failures += 1
    initial = {name: np.fromfile(out / "init" / name, dtype=np.float32) for name in names}
    moved = sum(float(np.max(np.abs(np.fromfile(expected_folder / n, dtype=np.float32) - initial[n]))) > 0
                for n in names)
    print(f"{len(names)} parameters x {ranks} ranks compared; {moved} moved from their start")
    return failures


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "reference":
        reference(dict(item.split("=", 1) for item in sys.argv[2:]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loom-run", required=True)
    parser.add_argument("--program", required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--mode", choices=("full", "lora"), required=True)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loom-ddp-vs-pytorch-") as folder:
        out = Path(folder)
        arguments = [f"{k}={v}" for k, v in {**SETTINGS, "mode": options.mode, "skips": skips(options.ranks),
                                              "out": str(out)}.items()]
        launch = [options.loom_run, "--nproc-per-node", str(options.ranks), "--"]
        run(launch + [options.program] + arguments)
        run(launch + [options.python, os.path.abspath(__file__), "reference"] + arguments)
        failures = compare(out, options.ranks)
    if failures:
        sys.exit(f"FAILED: {failures} parameter(s) differ from PyTorch's DistributedDataParallel")
    print("loom's ddp() equals PyTorch's DistributedDataParallel(find_unused_parameters=True)")


if __name__ == "__main__":
    main()
