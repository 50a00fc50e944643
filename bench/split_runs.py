"""What bench/sequence_parallel and bench/tensor_parallel share: loom-bench's long-* workloads (a Wan and
a Llama sequence of 8192 tokens, docs/benchmarks.md) on 4 ranks, split k ways by one stage and not
split at all, alternating, each repetition running every k in turn; a Markdown table of step time,
activations, peak RSS and tokens/s against k = 1, written into docs/benchmarks.md between the
script's markers."""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench_runs import run_once  # bench/, beside this script

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = {"wan": "long-wan", "llama": "long-llama"}
RANKS = 4
RUN_TIMEOUT_S = 900  # one run of 4 ranks on 2 cores: tens of seconds, minutes under load


@dataclass(frozen=True)
class Split:
    script: str  # bench/<script>, whose markers delimit its table in docs/benchmarks.md
    tag: str  # the workloads' names: long-wan-<tag>2-fsdp
    sizes: dict[str, tuple[int, ...]]  # the k each family runs at (1: the unsplit long-*-fsdp)
    tokens_per_rank: Callable[[int, int], int]  # of a sequence of n tokens at k

    def workload(self, family: str, k: int) -> str:
        return f"{FAMILIES[family]}-fsdp" if k == 1 else f"{FAMILIES[family]}-{self.tag}{k}-fsdp"

    def markers(self) -> tuple[str, str]:
        return (f"<!-- bench/{self.script}: generated from here -->",
                f"<!-- bench/{self.script}: generated up to here -->")


def run(build: Path, name: str, steps: int, warmup: int) -> dict:
    command = [str(build / "loom-run"), "--no-prefix", "--nproc-per-node", str(RANKS), "--",
               str(build / "bench" / "loom-bench"), "--workload", name, "--steps", str(steps), "--warmup", str(warmup)]
    try:
        return run_once(command, RUN_TIMEOUT_S)
    except RuntimeError as error:
        sys.exit(f"{name} printed no result:\n{error}")


def ratio_text(values: list[float], baseline: list[float]) -> str:
    paired = [v / b for v, b in zip(values, baseline)]
    return (f"**{statistics.median(values) / statistics.median(baseline):.3f}** "
            f"({min(paired):.3f}–{max(paired):.3f})")


def sizes_text(sizes: list[int]) -> str:
    return ", ".join(str(k) for k in sizes)


def main(split: Split, description: str) -> int:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--families", nargs="+", choices=list(FAMILIES), default=list(FAMILIES),
                        help="the long-* models to run (default: both)")
    parser.add_argument("--build", type=Path, default=ROOT / "build")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmarks.md",
                        help="the Markdown file whose part between the script's markers the table replaces")
    args = parser.parse_args()
    families = [f for f in FAMILIES if f in args.families]
    all_sizes = sorted({k for f in families for k in split.sizes[f]})

    load_before = os.getloadavg()
    results: dict[str, list[dict]] = {}
    for repetition in range(args.repetitions):
        for family in families:
            for k in split.sizes[family]:
                name = split.workload(family, k)
                result = run(args.build, name, args.steps, args.warmup)
                results.setdefault(name, []).append(result)
                print(f"repetition {repetition + 1}: {name} {result['step_ms_median']:.0f} ms/step, "
                      f"activations {result['activation_mb_max']:.1f} MB/rank", file=sys.stderr)
    load_after = os.getloadavg()

    lines = [
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} logical "
        f"CPUs; load average before {load_before[0]:.2f}, after {load_after[0]:.2f}",
        f"- {RANKS} ranks on this machine, Gloo over loopback, one intra-op thread per rank; {args.steps} counted steps "
        f"after {args.warmup} warm-up, {args.repetitions} repetitions, each running k = {sizes_text(all_sizes)} in turn",
        "- step time: the slowest rank's median step, then the median over the repetitions; activations: the heap "
        "a rank holds between the forward (its loss computed) and the backward, the largest rank's median step; "
        "ratios are of medians against k = 1, with the paired ratios' range",
        "",
        "| workload | k × data ranks | tokens per rank | step ms | vs k = 1 | activations MB/rank | vs k = 1 | "
        "peak RSS MB | tokens/s |",
        "|---|---|---:|---:|---|---:|---|---:|---:|",
    ]
    for family in families:
        baseline = results[split.workload(family, 1)]
        base_ms = [r["step_ms_median"] for r in baseline]
        base_mb = [r["activation_mb_max"] for r in baseline]
        for k in split.sizes[family]:
            runs = results[split.workload(family, k)]
            ms = [r["step_ms_median"] for r in runs]
            mb = [r["activation_mb_max"] for r in runs]
            lines.append(
                f"| `{split.workload(family, k)}` | {k} × {RANKS // k} | "
                f"{split.tokens_per_rank(runs[0]['seq_len'], k)} | {statistics.median(ms):.0f} | "
                f"{'—' if k == 1 else ratio_text(ms, base_ms)} | {statistics.median(mb):.1f} | "
                f"{'—' if k == 1 else ratio_text(mb, base_mb)} | "
                f"{statistics.median(r['rss_peak_mb_max'] for r in runs):.0f} | "
                f"{statistics.median(r['tokens_per_s'] for r in runs):.0f} |")
    only = "" if families == list(FAMILIES) else " --families " + " ".join(families)
    lines += ["", "Reproduce (from the repository root, after `ninja -C build bench/loom-bench loom-run`):", "",
              f"    bench/{split.script} --repetitions {args.repetitions} --steps {args.steps} "
              f"--warmup {args.warmup}{only}"]
    table = "\n".join(lines)
    print(table)

    begin, end = split.markers()
    text = args.doc.read_text()
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        args.doc.write_text(f"{head}{begin}\n\n{table}\n\n{end}{tail}")
    return 0
