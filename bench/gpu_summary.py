"""The GPU check's benchmark lines as a Markdown table: per workload, the median step time of each
implementation over the repetitions and their ratio (loom / PyTorch), with the range of the paired
ratios.

    gpu_summary.py bench.jsonl
"""
import json
import statistics
import sys
from collections import defaultdict


def main() -> int:
    runs = defaultdict(lambda: defaultdict(list))
    for line in open(sys.argv[1]):
        if line.startswith("{"):
            row = json.loads(line)
            runs[row["workload"]][row["impl"]].append(row)
    print("| workload | loom ms/step | PyTorch ms/step | loom / PyTorch (paired range) | final loss loom / PyTorch |")
    print("|---|---|---|---|---|")
    for workload, impls in runs.items():
        loom, torch = impls.get("loom", []), impls.get("torch-python", [])
        if not loom or not torch:
            print(f"| {workload} | {len(loom)} runs | {len(torch)} runs | - | - |")
            continue
        a = statistics.median(r["step_ms_median"] for r in loom)
        b = statistics.median(r["step_ms_median"] for r in torch)
        paired = sorted(x["step_ms_median"] / y["step_ms_median"] for x, y in zip(loom, torch))
        print(f"| {workload} | {a:.2f} | {b:.2f} | {a / b:.3f} ({paired[0]:.3f}-{paired[-1]:.3f}) "
              f"| {loom[-1]['final_loss']:.4f} / {torch[-1]['final_loss']:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
