#!/usr/bin/env python3
"""The host memory a job needs to come up, on a random 184 MB Llama that transformers makes here
(bench/build_memory.cpp measures it: the peak resident set once built over the one before build,
and the peak of live tensor storage until built):

- under local() at one rank, pretrained(...) reads the checkpoint tensor by tensor straight into the
  model: the model plus one tensor and a constant, never the model plus the whole checkpoint;
- under fsdp() at two ranks no rank constructs the whole model: from the checkpoint or seeded from
  scratch, each rank needs half the model, one unit (decoder layer) and a constant, where a model
  fsdp() constructs whole (its constructor draws) needs the whole model first.

    pretrained_memory_check.py LOOM_RUN BUILD_MEMORY SOURCE_DIR
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

# The runtime's rendezvous, the libraries' first allocations and the build's own temporaries: the
# constant of the bounds.
CONSTANT_MB = 64


def measure(loom_run: str, build_memory: str, model: Path, ranks: int, *options: str) -> dict | None:
    done = subprocess.run([loom_run, "--no-prefix", "--nproc-per-node", str(ranks), "--", build_memory,
                           "--checkpoint", str(model), *options], capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stdout, done.stderr)
        return None
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))


def main() -> int:
    loom_run, build_memory, source = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    failed = False
    with tempfile.TemporaryDirectory(prefix="loom-pretrained-memory-") as scratch:
        model = Path(scratch) / "model"
        subprocess.run([sys.executable, source / "dsl_examples" / "data" / "make_lm.py", model, "--hidden", "1024",
                        "--layers", "4"], check=True)
        local = measure(loom_run, build_memory, model, 1)
        if local is None:
            return 1
        bound = local["model_mb"] + local["largest_tensor_mb"] + CONSTANT_MB
        print(f"local(), pretrained: building took {local['build_mb']:.1f} MB for a {local['model_mb']:.1f} MB model "
              f"(largest tensor {local['largest_tensor_mb']:.1f} MB); the bound is {bound:.1f} MB")
        if local["build_mb"] > bound:
            print("FAIL: pretrained(...) held more than the model and one tensor of the checkpoint")
            failed = True

        whole = measure(loom_run, build_memory, model, 2, "--strategy", "fsdp", "--construct", "whole")
        if whole is None:
            return 1
        print(f"fsdp() at 2 ranks, constructed whole: {whole['build_mb']:.1f} MB, "
              f"live tensors at most {whole['build_live_mb']:.1f} MB")
        for init in ("pretrained", "seeded"):
            sharded = measure(loom_run, build_memory, model, 2, "--strategy", "fsdp", "--init", init)
            if sharded is None:
                return 1
            bound = sharded["model_mb"] / 2 + sharded["largest_unit_mb"] + CONSTANT_MB
            print(f"fsdp() at 2 ranks, {init}, constructed without the full replica: {sharded['build_mb']:.1f} MB, "
                  f"live tensors at most {sharded['build_live_mb']:.1f} MB (half the model "
                  f"{sharded['model_mb'] / 2:.1f} MB, largest unit {sharded['largest_unit_mb']:.1f} MB); "
                  f"the bound is {bound:.1f} MB")
            if sharded["build_mb"] > bound or sharded["build_live_mb"] > bound:
                print(f"FAIL: a rank held more than its half of the model, one unit and {CONSTANT_MB} MB")
                failed = True
            if sharded["build_live_mb"] >= whole["build_live_mb"] - sharded["model_mb"] / 4:
                print("FAIL: constructing without the full replica saved less than a quarter of the model")
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
