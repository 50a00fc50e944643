"""Two runs of device-parity from one start trained the same model: every tensor moved the same way in
both, within a tolerance of how far it moved.

    parity.py START.safetensors A.safetensors B.safetensors [TOLERANCE]

For each tensor, the root mean square of B - A over the larger of the root mean square of A - START
(how far that tensor moved) and the model's own (how far all its trained tensors moved, over every
element), so that a tensor the runs moved only by rounding (an attention's key bias, whose gradient
is zero in exact arithmetic) is judged against the model's progress, not against its own noise.
Measured over a tensor, not its worst element: a wrong collective, a missed or doubled gradient or
a misplaced shard moves a whole tensor or a whole slice of one by as much as training did, which is
a ratio near 1 and far above the tolerance, while the kernels' last bits, under SGD's step (linear
in the gradient), stay a ratio of 1e-6 in fp32 and about 1e-2 in bf16. The report names the tensor
with the largest ratio.
"""
import math
import sys

import torch
from safetensors.torch import load_file


def rms(t: torch.Tensor) -> float:
    return float(t.double().pow(2).mean().sqrt()) if t.numel() else 0.0


def compare(start: dict, a: dict, b: dict, tolerance: float) -> tuple[bool, str]:
    if not (start.keys() == a.keys() == b.keys()):
        names = sorted((start.keys() | a.keys() | b.keys()) - (start.keys() & a.keys() & b.keys()))
        return False, f"parity: the files name different tensors: {names}"
    shapes = [name for name in sorted(a) if not (start[name].shape == a[name].shape == b[name].shape)]
    if shapes:
        return False, f"parity: the files hold tensors of different shapes: {shapes}"
    moved = {name: a[name].double() - start[name].double() for name in a}
    total = sum(m.numel() for m in moved.values() if m.any())  # the trained tensors' elements, frozen ones left out
    progress = math.sqrt(sum(float(m.pow(2).sum()) for m in moved.values()) / total) if total else 0.0
    if progress == 0.0:
        return False, "parity: run A did not move the model from its start, so the runs cannot be compared; train for more steps"
    worst_name, worst = "", 0.0
    for name in sorted(a):
        ratio = rms(b[name].double() - a[name].double()) / max(rms(moved[name]), progress)
        if ratio > worst:
            worst_name, worst = name, ratio
    verdict = "ok" if worst <= tolerance else "FAIL"
    return worst <= tolerance, (
        f"parity {verdict}: {len(a)} tensors, the runs differ by at most {worst:.3g} of how far a tensor moved "
        f"({worst_name or '-'}; the model moved {progress:.3g} on average), tolerance {tolerance:g}")


def main() -> int:
    if len(sys.argv) not in (4, 5):
        print("usage: parity.py START.safetensors A.safetensors B.safetensors [TOLERANCE]", file=sys.stderr)
        return 2
    start, a, b = (load_file(path) for path in sys.argv[1:4])
    tolerance = float(sys.argv[4]) if len(sys.argv) > 4 else 1e-4
    ok, report = compare(start, a, b, tolerance)
    print(report)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
