"""Runs device-parity twice under loom-run, each with its own environment, and compares the models.

    run_parity.py LOOM_RUN DEVICE_PARITY STRATEGY RANKS STEPS TOLERANCE 'A=1 B=2' 'C=3' [OUT_DIR]

The two environments are space-separated NAME=VALUE lists added to this one (an empty string adds
nothing). Both runs use RANKS ranks and start from the same model, which the first also writes; each
trained tensor must have moved the same way in both within TOLERANCE of how far it moved (parity.py).
STRATEGY is device-parity's for both runs, or A/B for the first run's and the second's (fsdp against
fsdp-offload, in one environment).
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> int:
    loom_run, program, strategy, ranks, steps, tolerance, env_a, env_b = sys.argv[1:9]
    out_dir = Path(sys.argv[9]) if len(sys.argv) > 9 else Path(tempfile.mkdtemp(prefix="loom-parity-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    strategy_a, _, strategy_b = strategy.partition("/")
    strategies = {"a": strategy_a, "b": strategy_b or strategy_a}
    stem = strategy.replace("/", "-vs-")
    start = out_dir / f"{stem}-{ranks}-start.safetensors"
    files = []
    for label, extra in (("a", env_a), ("b", env_b)):
        env = dict(os.environ)
        env.update(pair.split("=", 1) for pair in extra.split())
        out = out_dir / f"{stem}-{ranks}-{label}.safetensors"
        command = [loom_run, "--nproc-per-node", ranks, "--", program, strategies[label], str(out), steps]
        done = subprocess.run(command + ([str(start)] if label == "a" else []),
                              env=env, capture_output=True, text=True, timeout=600)
        print(f"[{extra or 'default'}] {strategies[label]} x{ranks}:",
              done.stdout.strip().splitlines()[-1:] or done.stderr[-500:])
        if done.returncode != 0:
            print(done.stdout[-2000:], done.stderr[-2000:])
            return 1
        files.append(str(out))
    return subprocess.run([sys.executable, str(Path(__file__).with_name("parity.py")), str(start), *files,
                           tolerance]).returncode


if __name__ == "__main__":
    sys.exit(main())
