"""Two models written by device-parity agree: every tensor, by name, within a tolerance relative to
the model's largest magnitude. Float32 kernels differ between CPU and CUDA in the last bits, and
AdamW turns that noise into whole steps where a gradient is zero in exact arithmetic (an attention's
key bias: softmax ignores a constant per row), so such a tensor drifts by about 1e-4 of the model's
scale in 8 steps; a wrong collective or a missed gradient moves the weights by lr x steps, 100 times
more. The report names the tensor that differs most.

    parity.py A.safetensors B.safetensors [TOLERANCE]
"""
import sys

from safetensors.torch import load_file


def main() -> int:
    # widened to fp32, bf16 ones too (a base held in bf16)
    a, b = ({name: t.float() for name, t in load_file(path).items()} for path in sys.argv[1:3])
    tolerance = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-4
    if a.keys() != b.keys():
        print(f"parity: the files name different tensors: {sorted(a.keys() ^ b.keys())}")
        return 1
    scale = max(max(float(abs(t).max()) for t in a.values()), 1e-6)
    worst_name, worst = "", 0.0
    for name in sorted(a):
        difference = float(abs(a[name] - b[name]).max()) / scale
        if difference > worst:
            worst_name, worst = name, difference
    verdict = "ok" if worst <= tolerance else "FAIL"
    print(f"parity {verdict}: {len(a)} tensors, largest difference {worst:.3g} of the model's scale {scale:.3g} "
          f"({worst_name or '-'}), tolerance {tolerance:g}")
    return 0 if worst <= tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
