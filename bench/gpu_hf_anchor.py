"""hf_anchor.py's real-model workloads on one device, for scripts/gpu-check: the anchor's own model,
adapters and FSDP2 wrapping (its `build`, imported from ANCHOR, not copied) with the mesh on this
device (an NCCL group of one on CUDA), its batches drawn from its generator on the CPU and moved to
the device, and each step timed to the end of its kernels (torch.cuda.synchronize), as loom-bench
times its steps. One untimed forward and backward under torch.utils.flop_counter gives the step's
model FLOPs (`model_flops_per_step`), from which gpu_summary.py works out both sides' MFU. Attention
is counted with its key and value broadcast to the query's heads, as grouped-query attention computes
it: torch before 2.12 counts attention only where they have as many heads as the query (pytorch/pytorch
#177169) and stops with an AssertionError on Llama's 2 key-value heads for 4, and it counts no
attention on the CPU.

    gpu_hf_anchor.py ANCHOR --workload llama-lora-bf16-fsdp [--steps 20] [--warmup 5] [--device cuda]
"""
import argparse
import importlib.util
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.device_mesh as device_mesh
from torch.utils import flop_counter


def with_query_heads(shape, query_shape) -> tuple:
    """A key's or value's shape with the query's heads: what grouped-query attention broadcasts it to."""
    return (shape[0], query_shape[1], *shape[2:])


def attention_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return flop_counter.sdpa_flop_count(query_shape, with_query_heads(key_shape, query_shape),
                                        with_query_heads(value_shape, query_shape))


def attention_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                             **kwargs) -> int:
    return flop_counter.sdpa_backward_flop_count(grad_out_shape, query_shape,
                                                 with_query_heads(key_shape, query_shape),
                                                 with_query_heads(value_shape, query_shape))


def attention_formulas() -> dict:
    """FlopCounterMode's custom_mapping: each fused attention kernel of this torch, forward and backward."""
    aten = torch.ops.aten
    kernels = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
               "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
    formulas = {}
    for name in kernels:
        for op, formula in ((name, attention_flops), (f"{name}_backward", attention_backward_flops)):
            if hasattr(aten, op):
                formulas[getattr(aten, op)] = formula
    return formulas


def load_anchor(path: str):
    spec = importlib.util.spec_from_file_location("hf_anchor", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Batches:
    """The anchor's batches, drawn as its main() draws them (seed 99 for rank 0), each moved to the device."""

    def __init__(self, anchor, family: str, dtype: torch.dtype, device: torch.device, seed: int = 99):
        self.anchor, self.family, self.dtype, self.device = anchor, family, dtype, device
        self.gen = torch.Generator().manual_seed(seed)

    def next(self) -> dict:
        a, gen = self.anchor, self.gen
        if self.family == "llama":
            ids = torch.randint(0, a.LLAMA["vocab_size"], (a.BATCH, a.SEQ), generator=gen).to(self.device)
            return {"ids": ids}
        x0 = torch.randn(a.WAN_LATENTS, generator=gen)
        noise = torch.randn(a.WAN_LATENTS, generator=gen)
        t = torch.randint(0, 1000, (a.WAN_LATENTS[0],), generator=gen)
        text = torch.randn(a.WAN_TEXT, generator=gen)
        s = (t.float() / 1000.0).view(-1, 1, 1, 1, 1)
        noisy = ((1 - s) * x0 + s * noise).to(self.dtype)
        moved = {"noisy": noisy, "t": t, "text": text.to(self.dtype), "velocity": noise - x0}
        return {k: v.to(self.device) for k, v in moved.items()}


def loss_of(model, family: str, batch: dict) -> torch.Tensor:
    if family == "llama":
        return model(input_ids=batch["ids"], labels=batch["ids"]).loss
    pred = model(hidden_states=batch["noisy"], timestep=batch["t"], encoder_hidden_states=batch["text"],
                 return_dict=False)[0]
    return torch.nn.functional.mse_loss(pred.float(), batch["velocity"])


def build_on(anchor, workload: str, checkpoint: str, device: torch.device) -> torch.nn.Module:
    """The anchor's build at world size 1, its mesh on `device` where the anchor's is on the CPU."""
    on_cpu = device_mesh.init_device_mesh
    device_mesh.init_device_mesh = lambda _type, shape, **kwargs: on_cpu(device.type, shape, **kwargs)
    try:
        model = anchor.build(workload, checkpoint, 1)
    finally:
        device_mesh.init_device_mesh = on_cpu
    return model if workload.endswith("-fsdp") else model.to(device)  # fully_shard moved it already


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("anchor", help="hf_anchor.py")
    ap.add_argument("--workload", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default="cuda", help="cuda (cuda:0), or cpu to try the script without a GPU")
    args = ap.parse_args()
    anchor = load_anchor(args.anchor)
    if args.workload not in anchor.WORKLOADS:
        ap.error(f"--workload {args.workload} is not one of hf_anchor.py's: {', '.join(anchor.WORKLOADS)}")
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    family = args.workload.split("-")[0]
    checkpoint = anchor.DEFAULT_CHECKPOINT.format(family=family)
    anchor.make_checkpoint(checkpoint, family)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)

    model = build_on(anchor, args.workload, checkpoint, device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4 if "lora" not in args.workload else 1e-3)
    dtype = torch.bfloat16 if "bf16" in args.workload else torch.float32

    # The model FLOPs of one step's forward and backward, on a batch of the same shapes from another
    # generator, so that the timed steps read the anchor's batches; its gradients are zeroed after.
    with flop_counter.FlopCounterMode(display=False, custom_mapping=attention_formulas()) as counter:
        loss_of(model, family, Batches(anchor, family, dtype, device, seed=7).next()).backward()
    opt.zero_grad(set_to_none=False)

    batches = Batches(anchor, family, dtype, device)
    times, loss_value = [], float("nan")
    for step in range(args.warmup + args.steps):
        batch = batches.next()
        synchronize(device)
        t0 = time.perf_counter()
        loss = loss_of(model, family, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        synchronize(device)
        t1 = time.perf_counter()
        loss_value = loss.float().item()
        if step >= args.warmup:
            times.append((t1 - t0) * 1000.0)

    step_ms = statistics.median(times)
    tokens = 1280 * anchor.WAN_LATENTS[0] if family == "wan" else anchor.BATCH * anchor.SEQ
    print(json.dumps({
        "impl": "hf-peft",
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "workload": args.workload,
        "world": 1,
        "local_batch": anchor.WAN_LATENTS[0] if family == "wan" else anchor.BATCH,
        "seq_len": 1280 if family == "wan" else anchor.SEQ,
        "steps": args.steps,
        "step_ms_median": round(step_ms, 3),
        "tokens_per_s": round(tokens / (step_ms / 1000.0), 1),
        "final_loss": round(loss_value, 5),
        "trainable_params": sum(p.numel() for p in params),
        "model_flops_per_step": counter.get_total_flops(),
        **({"device_peak_mb": round(torch.cuda.max_memory_allocated(device) / 2**20, 1)}
           if device.type == "cuda" else {}),
    }))
    sys.stdout.flush()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
