#!/usr/bin/env python3
"""A LoRA adapter and base weights trained in C++ load into PyTorch with PEFT, and the reverse; the
logits agree within 1e-5 both ways.

    peft_interop.py PEFT_TOOL
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_gpt import TinyGpt  # noqa: E402

CONFIG = dict(vocab=32, d=32, layers=2, heads=2, ctx=16)  # peft_tool.cpp's
TOLERANCE = 1e-5


def base_model(weights: Path) -> TinyGpt:
    model = TinyGpt(**CONFIG)
    model.load_state_dict(load_file(weights / "model.safetensors"), strict=True)
    return model.eval()


def loom_to_peft(tool: str, folder: Path) -> list[str]:
    subprocess.run([tool, "train", str(folder)], check=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a key PEFT does not use, or one it misses, is a failure
        model = PeftModel.from_pretrained(base_model(folder / "base"), folder / "adapter").eval()
    expected = load_file(folder / "logits.safetensors")
    with torch.no_grad():
        logits = model(expected["input"])
    difference = (logits - expected["logits"]).abs().max().item()
    print(f"loom -> PEFT: largest logit difference {difference:.3g}")
    return [] if difference <= TOLERANCE else [f"PEFT's logits differ from loom's by {difference}"]


def peft_to_loom(tool: str, folder: Path) -> list[str]:
    torch.manual_seed(3)
    base = TinyGpt(**CONFIG).eval()
    (folder / "base").mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in base.state_dict().items()}, folder / "base" / "model.safetensors")
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=6.5, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.1)  # B starts at zero: make the adapter matter
    model.save_pretrained(folder / "adapter")
    idx = torch.randint(0, CONFIG["vocab"], (3, CONFIG["ctx"]))
    with torch.no_grad():
        save_file({"input": idx, "logits": model(idx).contiguous()}, folder / "logits.safetensors")
    checked = subprocess.run([tool, "check", str(folder)], capture_output=True, text=True)
    print("PEFT -> loom:", checked.stdout.strip(), checked.stderr.strip())
    return [] if checked.returncode == 0 else ["loom's logits differ from PEFT's (or it could not load the files)"]


def main() -> int:
    tool = sys.argv[1]
    with tempfile.TemporaryDirectory() as folder:
        failures = loom_to_peft(tool, Path(folder) / "from-loom") + peft_to_loom(tool, Path(folder) / "from-peft")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
