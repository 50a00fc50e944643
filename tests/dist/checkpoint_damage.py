#!/usr/bin/env python3
"""A checkpoint damaged on disk is never loaded as if it were good. A run saves steps 4 and 8; then
one bit of step 8 is flipped (in a weight, the optimizer's archive, a generator's state or the
manifest), or one of its files is replaced by step 4's file of the same size. The next launch
names the checkpoint and the file, sets step 8 aside, resumes from step 4, and ends bit for bit
where a run never damaged ends. With --strict it stops instead, touching nothing; with step 4
damaged too there is nothing to fall back to, and it stops before any step.

    checkpoint_damage.py --loom-run LOOM_RUN --program DIST_RESUME --ranks N --strategy S
"""
from __future__ import annotations

import json
import shutil
import struct
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resume_runs import arguments, differences, launch, succeeded  # noqa: E402


def flip_tensor_bit(file: Path, prefix: str) -> str:
    """Flips one bit in the middle of the first tensor named `prefix`... that holds bytes; returns its name."""
    data = bytearray(file.read_bytes())
    header_length = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + header_length])
    name = next(n for n, spec in header.items()
                if n.startswith(prefix) and spec["data_offsets"][1] > spec["data_offsets"][0])
    begin, end = header[name]["data_offsets"]
    data[8 + header_length + (begin + end) // 2] ^= 0x10
    file.write_bytes(data)
    return name


def flip_manifest_bit(step: Path) -> str:
    """Flips the case of a letter in the manifest's describe text: still JSON, no longer what was saved."""
    manifest = step / "manifest.json"
    text = bytearray(manifest.read_bytes())
    at = text.index(b'"describe": "') + len(b'"describe": "')
    while not chr(text[at]).islower():
        at += 1
    text[at] ^= 0x20
    manifest.write_bytes(text)
    return "manifest.json"


def main() -> int:
    args = arguments()
    sharded = args.strategy != "ddp"
    weights_file = "rank-00001.safetensors" if sharded else "rank-00000.safetensors"
    # What is damaged, and how the message names it.
    cases = {
        "a weight": lambda step: (flip_tensor_bit(step / weights_file, "model/"), weights_file)[1],
        "the optimizer's archive": lambda step: (flip_tensor_bit(step / "rank-00000.safetensors", "optimizer"),
                                                 "rank-00000.safetensors")[1],
        "a generator's state": lambda step: (flip_tensor_bit(step / "rank-00001.safetensors", "rng/"),
                                             "rank-00001.safetensors")[1],
        "the manifest": flip_manifest_bit,
    }
    failures = []
    with tempfile.TemporaryDirectory() as root:
        straight = Path(root) / "straight"
        succeeded(launch(args, straight))

        def damaged_run(name: str) -> Path:
            folder = Path(root) / name.replace(" ", "-").replace("'", "")
            succeeded(launch(args, folder))
            for leftover in folder.glob("final-rank-*.safetensors"):
                leftover.unlink()
            return folder

        def check_fallback(case: str, folder: Path, file: str) -> None:
            checkpoints = folder / "checkpoints"
            resumed = launch(args, folder)
            said = resumed.stdout + resumed.stderr
            step8 = checkpoints / "step-00000008"
            if resumed.returncode != 0:
                failures.append(f"{case}: the relaunch failed ({resumed.returncode}): {said[-1500:]}")
                return
            named = "manifest.json" if file == "manifest.json" else f"file '{file}'"
            if f"the checkpoint '{step8}' is damaged: its {named}" not in said:
                failures.append(f"{case}: no message naming step 8 and '{file}': {said[-1500:]}")
            if "set aside as 'step-00000008.damaged'" not in said or "falls back to" not in said:
                failures.append(f"{case}: the message does not say what happens next: {said[-1500:]}")
            if "resumed from step 4" not in resumed.stdout:
                failures.append(f"{case}: did not resume from step 4: {resumed.stdout[-500:]}")
            kept = sorted(p.name for p in checkpoints.iterdir())
            if kept != ["step-00000004", "step-00000008", "step-00000008.damaged"]:
                failures.append(f"{case}: the checkpoints left are {kept}")
            failures.extend(f"{case}: {line}" for line in differences(straight, folder, args.ranks))
            message = next((line for line in said.splitlines() if "is damaged" in line), "")
            print(f"step 8, {case}: named ({file}), set aside, resumed from step 4, ended bit for bit\n  {message}")

        for case, damage in cases.items():
            folder = damaged_run(case)
            check_fallback(case, folder, damage(folder / "checkpoints" / "step-00000008"))

        # A file replaced by another step's file of the same size: its size passes, its checksum does not.
        folder = damaged_run("replaced")
        step4, step8 = folder / "checkpoints" / "step-00000004", folder / "checkpoints" / "step-00000008"
        if (step4 / "rank-00000.safetensors").stat().st_size != (step8 / "rank-00000.safetensors").stat().st_size:
            failures.append("replaced: step 4's and step 8's files differ in size: the case tests the size check")
        shutil.copyfile(step4 / "rank-00000.safetensors", step8 / "rank-00000.safetensors")
        check_fallback("a file replaced by step 4's", folder, "rank-00000.safetensors")

        # strict: the run stops before any step and leaves every file as it was.
        folder = damaged_run("strict")
        step8 = folder / "checkpoints" / "step-00000008"
        flip_tensor_bit(step8 / weights_file, "model/")
        before = {p.name: p.read_bytes() for p in step8.iterdir()}
        refused = launch(args, folder, "--strict")
        said = refused.stdout + refused.stderr
        if refused.returncode == 0 or "checkpoint_options.strict refuses to fall back" not in said \
                or f"its file '{weights_file}' does not match the checksum" not in said:
            failures.append(f"strict: not refused with the reason ({refused.returncode}): {said[-1500:]}")
        if {p.name: p.read_bytes() for p in step8.iterdir()} != before or list(folder.glob("final-rank-*")):
            failures.append("strict: the refused run changed the checkpoint or trained")
        print("strict: a damaged step 8 stops the run, untouched")

        # Nothing to fall back to: step 8 and step 4 damaged.
        folder = damaged_run("nothing-left")
        for step in ("step-00000008", "step-00000004"):
            flip_tensor_bit(folder / "checkpoints" / step / weights_file, "model/")
        stopped = launch(args, folder)
        said = stopped.stdout + stopped.stderr
        if stopped.returncode == 0 or "no earlier complete checkpoint is left to fall back to" not in said \
                or "step-00000004' is damaged" not in said or list(folder.glob("final-rank-*")):
            failures.append(f"nothing left: not stopped before any step ({stopped.returncode}): {said[-1500:]}")
        print("steps 8 and 4 damaged: the run stops before any step, naming step 4's file")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
