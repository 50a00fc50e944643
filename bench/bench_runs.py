"""What bench/compare, bench/ab and bench/perf_account share: how many ranks a workload runs on, which
anchor runs it, and one benchmark run's JSON line (loom-bench's, or an anchor's)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

# The model families of ../shared/BENCHMARKS.md's "Real models", which hf_anchor.py runs; the toy
# workloads (mlp-*, gpt-*) are torch_anchor.py's.
REAL_FAMILIES = ("llama", "wan")


# loom's workloads that the anchor runs under another name: both QLoRA workloads against the anchor's
# one (PEFT's QLoRA guide, DDP; FSDP over bitsandbytes' 4-bit weights is not what its users run on a
# CPU), and Wan's fp8 base against the anchor's bf16 one (diffusers has no fp8 weight-only training).
ANCHOR_WORKLOAD = {"llama-qlora-bf16-fsdp": "llama-qlora-bf16-ddp", "wan-fp8-lora-bf16-fsdp": "wan-lora-bf16-fsdp"}


def anchor_workload(workload: str) -> str:
    return ANCHOR_WORKLOAD.get(workload, workload)


def ranks_for(workload: str) -> int:
    # Hybrid sharding's 2 × 2 mesh, and the long-* workloads' 4 ranks that a sequence or tensor-parallel
    # split divides 2 and 4 ways (bench/sequence_parallel, bench/tensor_parallel).
    if workload.endswith("-hsdp") or workload.startswith("long-"):
        return 4
    return 2 if workload.endswith(("-ddp", "-fsdp")) else 1


def family(workload: str) -> str:
    """The model a workload trains: the part of its name before the first '-' (llama, wan, gpt, mlp)."""
    return workload.split("-", 1)[0]


def anchor_script(root: Path, workload: str) -> Path:
    """The anchor of `workload`, beside the repository `root` in ../shared/bench/."""
    real = family(workload) in REAL_FAMILIES
    return root.parent / "shared" / "bench" / ("hf_anchor.py" if real else "torch_anchor.py")


def run_once(command: list[str], timeout_s: float, env: dict[str, str] | None = None) -> dict:
    """Runs one benchmark and returns its JSON line; raises RuntimeError with its output otherwise."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    for line in reversed(done.stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise RuntimeError(f"{' '.join(command)} exited {done.returncode} without a JSON line:\n"
                       f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
