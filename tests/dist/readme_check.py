"""The README's commands, run in the order it gives them, all succeed: every ```sh block's
scripts/demo, Python and build/loom-run lines, with small step counts and the README's /tmp folders
moved into a scratch one (the builds they start are meson's here; scripts/test is this suite). And
the README's sample outputs are what the commands print now: each plan line and `build:` line in its
output blocks (which depend on the plan and the model, not on the step counts) is printed by one of
the runs, paths aside.

    readme_check.py README LOOM_RUN TINY_GPT LM_FINETUNE WAN_FINETUNE PYTHON
"""
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

# Fewer steps and nothing else: the shipped run files' schedules are fractions of the steps, and
# the commands name their own folders (no override the README does not show).
SHORT_RUN_FILE = ["--train.steps=4", "--train.eval_every=2", "--train.log_every=2", "--train.checkpoint_every=2"]
SHORT_TINY_GPT = ["--steps-pretrain", "6", "--steps-adapt", "4", "--checkpoint-every", "3"]


def commands(readme: Path) -> list[str]:
    """Each ```sh block's lines, continuation lines joined, comments dropped, in order."""
    found = []
    for block in re.findall(r"```sh\n(.*?)```", readme.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line:
                found.append(line)
    return found


# The lines of a sample output that a short run prints as the README's long one did.
FIXED_LINE = re.compile(r"^\[rank 0\] (model<|seeded\(|default_dtype\(|pretrained\(|lora\(|trainable\(|recompute\(|"
                        r"mixed_precision\(|ddp\(|fsdp\(|local\(|build: )")


def without_paths(line: str) -> str:
    """The line with its quoted paths left out: the README's runs wrote into /tmp, these into a scratch folder."""
    return re.sub(r"'[^']*'", "'…'", re.sub(r'"[^"]*"', '"…"', line.rstrip()))


def sample_lines(readme: Path) -> list[str]:
    """The plan and build lines of every output block (a ``` block with no language), in order."""
    found, fence = [], None  # fence: the open block's language ("" for output), None outside blocks
    for line in readme.read_text().splitlines():
        if line.startswith("```"):
            fence = line[3:].strip() if fence is None else None
        elif fence == "" and FIXED_LINE.match(line):
            found.append(line.rstrip())
    return found


def runnable(line: str, scratch: Path, programs: dict[str, str]) -> list[str] | None:
    """The command as this test runs it, or None for one the suite does itself (builds, tests)."""
    words = shlex.split(line.replace("/tmp/loom-lm", str(scratch / "lm")).replace("/tmp/loom-wan",
                                                                                         str(scratch / "wan")))
    if words[0] in ("ninja", "scripts/test"):
        return None
    if words[0] == "scripts/demo":
        tail = words[1:]
        short = SHORT_RUN_FILE if "--config" in tail else SHORT_TINY_GPT
        return [programs["loom-run"], "--nproc-per-node", "2", "--", programs["tiny-gpt"], *tail, *short,
                "--out", str(scratch / "tiny-gpt")]
    if words[0] == ".venv/bin/python":
        return [programs["python"], *words[1:]]
    if words[0] == "build/loom-run":
        split = words.index("--")
        program = Path(words[split + 1]).name
        tail = words[split + 2:]
        if program in ("lm-finetune", "wan-finetune"):
            tail += SHORT_RUN_FILE
        return [programs["loom-run"], *words[1:split], "--", programs[program], *tail]
    raise SystemExit(f"readme_check: the README has a command this test does not know how to run: {line}")


def main() -> int:
    readme = Path(sys.argv[1])
    # Absolute: the commands run in the README's folder.
    programs = {name: str(Path(path).resolve()) for name, path in
                (("loom-run", sys.argv[2]), ("tiny-gpt", sys.argv[3]), ("lm-finetune", sys.argv[4]),
                 ("wan-finetune", sys.argv[5]))}
    programs["python"] = sys.argv[6]
    lines = commands(readme)
    if not any(line.startswith("scripts/demo --config") for line in lines):
        print("FAIL: the README gives no second phase from a run file")
        return 1
    ran = 0
    printed = set()
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        (scratch / "lm").mkdir()
        (scratch / "wan").mkdir()
        for line in lines:
            command = runnable(line, scratch, programs)
            if command is None:
                continue
            done = subprocess.run(command, cwd=readme.parent, capture_output=True, text=True, timeout=600)
            ran += 1
            if done.returncode != 0:
                print(f"FAIL: README command {ran} exited {done.returncode}: {line}\n"
                      f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
                return 1
            printed.update(without_paths(out) for out in (done.stdout + done.stderr).splitlines())
            print(f"ok: {line}")
    print(f"readme: {ran} commands ran, in the README's order")
    samples = sample_lines(readme)
    stale = [line for line in samples if without_paths(line) not in printed]
    if not samples or stale:
        print("FAIL: the README shows plan or build lines that no run printed: run its commands again and paste "
              "their output\n  " + "\n  ".join(stale or ["(no sample output found)"]))
        return 1
    print(f"readme: its {len(samples)} plan and build lines are what the runs print")
    return 0


if __name__ == "__main__":
    sys.exit(main())
