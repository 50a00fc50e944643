"""The GPU check's benchmark lines as a Markdown table: per workload, the median step time of each
implementation over the repetitions and their ratio (loom / the anchor: PyTorch's toy models, or
transformers / diffusers + PEFT + FSDP2 on the real ones), with the range of the paired ratios;
tokens/s where samples are sequences, and MFU where the anchor counted the step's model FLOPs
(bench/gpu_hf_anchor.py): those FLOPs over the median step, against the device's dense bf16 peak.

    gpu_summary.py bench.jsonl        (GPU_PEAK_TFLOPS overrides the peak looked up by device name)
"""
import json
import os
import statistics
import sys
from collections import defaultdict

# Dense bf16 tensor-core peaks from NVIDIA's data sheets (SXM parts), TFLOP/s.
BF16_PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0}
ANCHORS = ("torch-python", "hf-peft")


def peak_flops(device: str) -> float | None:
    if "GPU_PEAK_TFLOPS" in os.environ:
        return float(os.environ["GPU_PEAK_TFLOPS"]) * 1e12
    return next((tflops * 1e12 for name, tflops in BF16_PEAK_TFLOPS.items() if name in device), None)


def main() -> int:
    runs = defaultdict(lambda: defaultdict(list))
    for line in open(sys.argv[1]):
        if line.startswith("{"):
            row = json.loads(line)
            runs[row["workload"]][row["impl"]].append(row)
    print("| workload | loom ms/step | anchor ms/step | loom / anchor (paired range) | tokens/s loom / anchor "
          "| MFU loom / anchor | final loss loom / anchor |")
    print("|---|---|---|---|---|---|---|")
    peaks = set()
    for workload, impls in runs.items():
        loom = impls.get("loom", [])
        anchor = next((impls[name] for name in ANCHORS if name in impls), [])
        if not loom or not anchor:
            print(f"| {workload} | {len(loom)} runs | {len(anchor)} runs | - | - | - | - |")
            continue
        a = statistics.median(r["step_ms_median"] for r in loom)
        b = statistics.median(r["step_ms_median"] for r in anchor)
        paired = sorted(x["step_ms_median"] / y["step_ms_median"] for x, y in zip(loom, anchor))
        tokens = "-"
        if "seq_len" in anchor[-1]:
            per_step = anchor[-1]["world"] * anchor[-1]["local_batch"] * anchor[-1]["seq_len"]
            tokens = f"{per_step / (a / 1000):.0f} / {per_step / (b / 1000):.0f}"
        mfu = "-"
        flops, peak = anchor[-1].get("model_flops_per_step"), peak_flops(anchor[-1].get("device", ""))
        if flops and peak:
            peaks.add(f"{anchor[-1]['device']}: {peak / 1e12:.1f} TFLOP/s")
            mfu = f"{100 * flops / (a / 1000) / peak:.2f}% / {100 * flops / (b / 1000) / peak:.2f}%"
        print(f"| {workload} | {a:.2f} | {b:.2f} | {a / b:.3f} ({paired[0]:.3f}-{paired[-1]:.3f}) | {tokens} | {mfu} "
              f"| {loom[-1]['final_loss']:.4f} / {anchor[-1]['final_loss']:.4f} |")
    if peaks:
        print(f"\nMFU: the anchor's model FLOPs per step (torch.utils.flop_counter) over the median step, against "
              f"the dense bf16 peak ({'; '.join(sorted(peaks))}).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
