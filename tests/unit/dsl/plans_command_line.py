"""dsl_examples/plans' command line: --help prints the usage and exits 0; a rank that is no number is
one line and the hint, exit code 2, and no crash (it was `terminate called ... stoi`).

    plans_command_line.py PLANS
"""
import subprocess
import sys

plans = sys.argv[1]
failures = []


def run(*arguments: str) -> tuple[int, str]:
    done = subprocess.run([plans, *arguments], capture_output=True, text=True, timeout=60)
    said = done.stdout + done.stderr
    if "terminate called" in said or done.returncode < 0:
        failures.append(f"plans {' '.join(arguments)} crashed (exit {done.returncode}):\n{said}")
    return done.returncode, said


code, said = run("--help")
if code != 0 or "Usage" not in said or "rank" not in said:
    failures.append(f"plans --help: exit {code}, not 0 with the usage:\n{said}")
for bad in ("notanumber", "2.5", "99999999999999999999"):
    code, said = run(bad)
    lines = said.strip().splitlines()
    if code != 2 or len(lines) != 2 or bad not in lines[0] or lines[1] != "run 'plans --help' for usage":
        failures.append(f"plans {bad}: exit {code}, not 2 with one line naming it and the hint:\n{said}")
code, said = run("8")
if code != 0 or "# lora with a run-time rank" not in said:
    failures.append(f"plans 8: exit {code}, not 0 with the plan of rank 8:\n{said}")

for failure in failures:
    print(failure)
sys.exit(1 if failures else 0)
