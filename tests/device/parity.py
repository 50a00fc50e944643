"""Two models written by device-parity agree: every tensor, by name, within a relative tolerance of
the largest magnitude (float32 kernels differ between CPU and CUDA, and between a reduction's
orders, in the last bits; a wrong collective or a missed gradient differs by far more).

    parity.py A.safetensors B.safetensors [TOLERANCE]
"""
import sys

from safetensors.numpy import load_file


def main() -> int:
    a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
    tolerance = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-4
    if a.keys() != b.keys():
        print(f"parity: the files name different tensors: {sorted(a.keys() ^ b.keys())}")
        return 1
    worst_name, worst = "", 0.0
    for name in sorted(a):
        scale = max(float(abs(a[name]).max()), 1e-6)
        difference = float(abs(a[name] - b[name]).max()) / scale
        if difference > worst:
            worst_name, worst = name, difference
    verdict = "ok" if worst <= tolerance else "FAIL"
    print(f"parity {verdict}: {len(a)} tensors, largest relative difference {worst:.3g} ({worst_name or '-'}), "
          f"tolerance {tolerance:g}")
    return 0 if worst <= tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
