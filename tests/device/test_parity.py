"""parity.py's measure on made-up runs: what the engine gets wrong fails it, what the kernels round
passes it, and runs that cannot be compared are refused."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from parity import compare  # noqa: E402


def runs(seed: int = 0):
    """A start and a run from it: two trained tensors, a key bias that training leaves (its gradient is
    zero in exact arithmetic) and a frozen base."""
    gen = torch.Generator().manual_seed(seed)
    start = {
        "q.weight": torch.randn(24, 12, generator=gen),
        "v.weight": torch.randn(24, 12, generator=gen),
        "k.bias": torch.randn(24, generator=gen) * 0.1,
        "base.weight": torch.randn(12, 12, generator=gen),
    }
    step = {name: torch.randn(t.shape, generator=gen) * 1e-2 for name, t in start.items()}
    step["k.bias"].zero_()
    step["base.weight"].zero_()
    a = {name: start[name] + step[name] for name in start}
    return start, a, step, gen


def check(label: str, ok: bool, report: str, expected: bool, mentions: str = "") -> list[str]:
    print(f"{label}: {report}")
    failures = [] if ok == expected else [f"{label}: expected {'a pass' if expected else 'a failure'}: {report}"]
    if mentions and mentions not in report:
        failures.append(f"{label}: the report does not name {mentions!r}: {report}")
    return failures


def main() -> int:
    failures = []
    start, a, step, gen = runs()

    same = {name: t.clone() for name, t in a.items()}
    failures += check("identical runs", *compare(start, a, same, 0.0), expected=True)

    # fp32 rounding in every gradient, and a key bias moved by rounding alone (1e-6 of the model's steps)
    rounded = {name: a[name] + step[name] * 1e-6 * torch.randn(a[name].shape, generator=gen) for name in a}
    rounded["k.bias"] = a["k.bias"] + 1e-8 * torch.randn(24, generator=gen)
    failures += check("last-bit differences", *compare(start, a, rounded, 1e-4), expected=True)

    # bf16's rounding: 1% of each step, the bias's noise 1% of the model's progress, in both directions
    bf16 = {name: a[name] + step[name] * 1e-2 * torch.randn(a[name].shape, generator=gen) for name in a}
    noisy_bias = {**a, "k.bias": a["k.bias"] + 1e-4 * torch.randn(24, generator=gen)}
    bf16["k.bias"] = noisy_bias["k.bias"] - 1e-4 * torch.randn(24, generator=gen)
    failures += check("bf16-sized rounding", *compare(start, noisy_bias, bf16, 3e-2), expected=True)

    doubled = {**a, "v.weight": start["v.weight"] + 2 * step["v.weight"]}  # a gradient summed twice
    failures += check("one tensor's gradient doubled", *compare(start, a, doubled, 3e-2), expected=False,
                      mentions="v.weight")

    misplaced = {**a, "q.weight": a["q.weight"].clone()}  # one rank's rows of a shard never updated
    misplaced["q.weight"][12:] = start["q.weight"][12:]
    failures += check("half a shard not updated", *compare(start, a, misplaced, 3e-2), expected=False,
                      mentions="q.weight")

    moved_frozen = {**a, "base.weight": a["base.weight"] + 1e-2}  # a frozen tensor trained on one side
    failures += check("a frozen tensor moved", *compare(start, a, moved_frozen, 3e-2), expected=False,
                      mentions="base.weight")

    failures += check("no training", *compare(start, start, start, 1.0), expected=False, mentions="did not move")
    renamed = {("o.weight" if name == "v.weight" else name): t for name, t in a.items()}
    failures += check("other names", *compare(start, a, renamed, 1.0), expected=False, mentions="different tensors")
    reshaped = {**a, "k.bias": a["k.bias"][:12]}
    failures += check("other shapes", *compare(start, a, reshaped, 1.0), expected=False, mentions="different shapes")

    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
