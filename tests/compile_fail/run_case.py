#!/usr/bin/env python3
"""Runs one compile-fail case of loom's DSL.

A case is a .cpp file with a directive in a comment:

    // expect: <regex>    must not compile; the first error line must match <regex>, and the whole
                          diagnostic must fit in the line budget; compiled with -DLOOM_CF_PASS (the
                          passing twin: the same file with the mistake fixed) it must compile cleanly
    // expect: pass       must compile cleanly (the canary that proves the headers build at all)

Usage: run_case.py CASE.cpp --include DIR [--budget N] -- COMPILER [COMPILER ARGS...]
"""

import argparse
import re
import subprocess
import sys

# The longest diagnostic a rule may print (stderr lines, carets and notes included); docs/rules.md.
DEFAULT_BUDGET = 16

FLAGS = ["-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", "-Wpedantic", "-Werror",
         "-fdiagnostics-color=never"]

ERROR_LINE = re.compile(r"(?:^|: )(?:fatal )?error: ")


def compile_case(compiler, include, case, defines):
    command = compiler + FLAGS + ["-I", include] + defines + [case]
    result = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=300)
    return result.returncode, result.stderr


def expectation(case):
    with open(case, encoding="utf-8") as source:
        for line in source:
            match = re.match(r"\s*//\s*expect:\s*(.+?)\s*$", line)
            if match:
                return match.group(1)
    sys.exit(f"{case}: no '// expect: <regex>' or '// expect: pass' comment")


def fail(case, what, stderr=""):
    print(f"FAIL {case}: {what}")
    if stderr:
        print("---- compiler output ----")
        print(stderr, end="")
    return 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("case")
    parser.add_argument("--include", required=True)
    parser.add_argument("--budget", type=int, default=DEFAULT_BUDGET)
    parser.add_argument("compiler", nargs="+")
    args = parser.parse_args()
    case, expected = args.case, expectation(args.case)

    if expected == "pass":
        status, stderr = compile_case(args.compiler, args.include, case, [])
        if status != 0 or stderr:
            return fail(case, "the canary does not compile cleanly", stderr)
        print(f"ok {case}: compiles")
        return 0

    status, stderr = compile_case(args.compiler, args.include, case, [])
    if status == 0:
        return fail(case, "compiles, but must not", stderr)
    lines = stderr.splitlines()
    first_error = next((line for line in lines if ERROR_LINE.search(line)), None)
    if first_error is None:
        return fail(case, "fails without an error line", stderr)
    if not re.search(expected, first_error):
        return fail(case, f"the first error does not match /{expected}/:\n  {first_error}", stderr)
    if len(lines) > args.budget:
        return fail(case, f"the diagnostic is {len(lines)} lines, over the budget of {args.budget}", stderr)

    status, stderr = compile_case(args.compiler, args.include, case, ["-DLOOM_CF_PASS"])
    if status != 0 or stderr:
        return fail(case, "the passing twin (-DLOOM_CF_PASS) does not compile cleanly", stderr)

    print(f"ok {case}: fails in {len(lines)} lines with /{expected}/; its twin compiles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
