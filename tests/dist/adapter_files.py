"""What finetune's runs leave to compare: the PEFT adapter in a run's out/adapter folder."""
from __future__ import annotations

import filecmp
from pathlib import Path

ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")


def adapter_differences(expected: Path, actual: Path) -> list[str]:
    """The adapter files of run `actual` that are not byte for byte those of run `expected`."""
    return [f"{file} differs from the uninterrupted run's" for file in ADAPTER_FILES
            if not filecmp.cmp(expected / "adapter" / file, actual / "adapter" / file, shallow=False)]
