#!/usr/bin/env python3
"""Python's safetensors reads what loom writes, and loom reads what Python's safetensors writes.

    safetensors_interop.py SAFETENSORS_TOOL
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
          "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8}


def reference_tensors() -> dict[str, torch.Tensor]:
    """The tensors safetensors_tool.cpp writes: arange(12) as 3 x 4 in each dtype, booleans its parity."""
    base = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    tensors = {f"t_{name}": base.to(dtype) for name, dtype in DTYPES.items()}
    tensors["t_BOOL"] = (base % 2).to(torch.bool)
    return tensors


def describe(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> list[str]:
    """What `safetensors_tool read` prints for the same content."""
    names = {dtype: name for name, dtype in DTYPES.items()} | {torch.bool: "BOOL"}
    lines = [f"{name} {names[t.dtype]} [{','.join(map(str, t.shape))}] {t.double().sum().item():g}"
             for name, t in tensors.items()]
    lines += [f"meta {key} {value}" for key, value in metadata.items()]
    return sorted(lines)


def main() -> int:
    tool = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as folder:
        written_by_loom = Path(folder) / "loom.safetensors"
        subprocess.run([tool, "write", str(written_by_loom)], check=True)
        loaded = load_file(written_by_loom)
        with safe_open(written_by_loom, framework="pt") as handle:
            metadata = handle.metadata()
        expected = reference_tensors()
        if loaded.keys() != expected.keys():
            failures.append(f"Python read the names {sorted(loaded)} from loom's file, expected {sorted(expected)}")
        for name, tensor in expected.items():
            if name in loaded and (loaded[name].dtype != tensor.dtype or not torch.equal(loaded[name], tensor)):
                failures.append(f"Python read {name} from loom's file as {loaded[name]}, expected {tensor}")
        if metadata != {"written_by": "loom"}:
            failures.append(f"Python read the metadata {metadata} from loom's file")

        written_by_python = Path(folder) / "python.safetensors"
        python_metadata = {"format": "pt", "written_by": "python"}
        save_file(expected, written_by_python, metadata=python_metadata)
        read = subprocess.run([tool, "read", str(written_by_python)], check=True, capture_output=True, text=True)
        if read.stdout.splitlines() != describe(expected, python_metadata):
            failures.append("loom read Python's file as:\n" + read.stdout + "expected:\n" +
                            "\n".join(describe(expected, python_metadata)))
    for failure in failures:
        print("FAIL:", failure)
    print("safetensors interop:", "ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
