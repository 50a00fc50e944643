#!/usr/bin/env python3
"""pretrained(...) reads a checkpoint tensor by tensor, straight into the model: the host memory a
job needs to come up is the model plus one tensor of the checkpoint and a constant, never the model
plus the whole checkpoint. On a random 184 MB Llama that transformers makes here, under local() at
one rank (bench/build_memory.cpp measures it: the peak resident set after the first forward over the
one before build).

    pretrained_memory_check.py LOOM_RUN BUILD_MEMORY SOURCE_DIR
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

# LibTorch's first forward (its kernels' buffers, the allocator's arenas) and the build's own
# temporaries, measured at 46 MB on this model (25 MB on a 354 MB one): the constant of the bound.
CONSTANT_MB = 64


def main() -> int:
    loom_run, build_memory, source = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    with tempfile.TemporaryDirectory(prefix="loom-pretrained-memory-") as scratch:
        model = Path(scratch) / "model"
        subprocess.run([sys.executable, source / "dsl_examples" / "data" / "make_llama.py", model, "--hidden", "1024",
                        "--layers", "4"], check=True)
        done = subprocess.run([loom_run, "--no-prefix", "--", build_memory, "--checkpoint", str(model)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout, done.stderr)
            return 1
        figures = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    bound = figures["model_mb"] + figures["largest_tensor_mb"] + CONSTANT_MB
    print(f"building took {figures['build_mb']:.1f} MB for a {figures['model_mb']:.1f} MB model "
          f"(largest tensor {figures['largest_tensor_mb']:.1f} MB); the bound is {bound:.1f} MB")
    if figures["build_mb"] > bound:
        print("FAIL: pretrained(...) held more than the model and one tensor of the checkpoint")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
