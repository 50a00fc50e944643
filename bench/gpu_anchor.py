"""The anchor's workloads on one CUDA device, for scripts/gpu-check: the models, adapters and data
of ../shared/bench/torch_anchor.py (imported from ANCHOR, not copied), with the model and every
batch on cuda:0, and each step timed to the end of its kernels (torch.cuda.synchronize), as
loom-bench times its steps on a GPU. One process: `ddp` is the plain model there, as the anchor has
it at world size 1, and `fsdp` is FSDP2 over a mesh of one CUDA device (an NCCL group of one).

    gpu_anchor.py ANCHOR --workload gpt-fsdp [--steps 30] [--warmup 5] [--batch N]
"""
import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F


def load_anchor(path: str):
    spec = importlib.util.spec_from_file_location("torch_anchor", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("anchor")
    ap.add_argument("--workload", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=0)
    args = ap.parse_args()
    anchor = load_anchor(args.anchor)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)

    family, *rest = args.workload.split("-")
    strategy = rest[-1]
    ctx = 512 if "long" in rest else 128
    torch.manual_seed(1234)
    model = anchor.Mlp() if family == "mlp" else anchor.TinyGpt(ctx=ctx)
    batch = args.batch or (32 if family == "mlp" else 4 if "long" in rest else 8)
    if "lora" in rest:
        anchor.add_lora(model, 8, ("q_proj", "k_proj", "v_proj", "o_proj"))
    if "recompute" in rest:
        anchor.recompute_blocks(model)
    model = model.to(device)  # built on the CPU from the seed, as the anchor's and loom's are
    torch.set_default_device(device)  # the anchor's TinyGpt makes its positions with torch.arange(t)
    if strategy == "fsdp":
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl", rank=0, world_size=1)
        from torch.distributed.device_mesh import init_device_mesh
        fully_shard = anchor.fully_shard_fn()
        mesh = init_device_mesh("cuda", (1,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1e-3) if family == "mlp" else torch.optim.AdamW(params, lr=3e-4)

    gen = torch.Generator(device="cpu").manual_seed(99)
    times = []
    loss_value = float("nan")
    for step in range(args.warmup + args.steps):
        cpu = torch.device("cpu")  # the anchor's batches, drawn where its generator lives
        if family == "mlp":
            x = torch.randn(batch, 1024, generator=gen, device=cpu)
            y = torch.randn(batch, 1024, generator=gen, device=cpu)
        else:
            x = torch.randint(0, 128, (batch, ctx), generator=gen, device=cpu)
            y = torch.randint(0, 128, (batch, ctx), generator=gen, device=cpu)
        x, y = x.to(device), y.to(device)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = F.mse_loss(model(x), y) if family == "mlp" else model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        loss_value = loss.item()
        if step >= args.warmup:
            times.append((t1 - t0) * 1000.0)
    print(json.dumps({
        "impl": "torch-python",
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device),
        "workload": args.workload,
        "world": 1,
        "local_batch": batch,
        "steps": args.steps,
        "step_ms_median": round(statistics.median(times), 3),
        "final_loss": round(loss_value, 5),
        "trainable_params": sum(p.numel() for p in params),
        "device_peak_mb": round(torch.cuda.max_memory_allocated(device) / 2**20, 1),
    }))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
