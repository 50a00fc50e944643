#!/usr/bin/env python3
"""Compiles and runs a program written against loom's previous names (docs/changes.md).

It is compiled as a program outside loom's tree is, with pkg-config's flags and the usual warnings
but not -Werror: an old name is a warning, never an error. The line below each comment
"// deprecated: X" must draw a deprecation warning that names X (an #include's, the deprecated
header's #pragma warning), so that a name whose alias went away, or whose warning no longer says
what replaces it, fails here. Then the program runs, and must exit 0.

usage: check_old_names.py PROGRAM.cpp BUILD_DIR CXX...
"""
import os
import pathlib
import re
import subprocess
import sys
import tempfile

MARK = re.compile(r"^\s*//\s*deprecated:\s*(.+?)\s*$")
WARNING = re.compile(r"^(?P<file>[^:\s][^:]*):(?P<line>\d+):(?:\d+:)? warning: (?P<text>.*)$")
INCLUDED_FROM = re.compile(r"^(?:In file included from|\s+from) (?P<file>[^:]+):(?P<line>\d+)[:,]?$")


def expected_warnings(program: pathlib.Path) -> dict[int, str]:
    """The line each mark is for (the next one), and the text its warning must name."""
    lines = program.read_text(encoding="utf-8").splitlines()
    return {number + 1: MARK.match(line).group(1)
            for number, line in enumerate(lines, start=1) if MARK.match(line)}


def warnings_by_line(output: str, program: pathlib.Path) -> dict[int, list[str]]:
    """The warnings of each line of the program: its own, and its #includes' (the outermost file of
    an "In file included from" chain)."""
    found: dict[int, list[str]] = {}
    included_at = None
    for line in output.splitlines():
        if (chain := INCLUDED_FROM.match(line)):
            if pathlib.Path(chain["file"]).resolve() == program:
                included_at = int(chain["line"])
            continue
        if (warning := WARNING.match(line)):
            at = int(warning["line"]) if pathlib.Path(warning["file"]).resolve() == program else included_at
            if at is not None:
                found.setdefault(at, []).append(warning["text"])
        included_at = None
    return found


def main() -> int:
    program, build = pathlib.Path(sys.argv[1]).resolve(), pathlib.Path(sys.argv[2])
    compiler = sys.argv[3:]
    environment = dict(os.environ, PKG_CONFIG_PATH=str(build / "meson-uninstalled"))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "loom"], env=environment, check=True,
                           capture_output=True, text=True).stdout.split()
    with tempfile.TemporaryDirectory() as scratch:
        binary = pathlib.Path(scratch) / program.stem
        compiled = subprocess.run(compiler + ["-std=c++20", "-Wall", "-Wextra", "-fdiagnostics-color=never",
                                              str(program), "-o", str(binary)] + flags,
                                  capture_output=True, text=True, errors="replace")
        if compiled.returncode != 0:
            print(f"FAIL: {program.name} does not compile against loom's current headers")
            print(compiled.stderr, end="")
            return 1

        found = warnings_by_line(compiled.stderr, program)
        missing = []
        for line, name in sorted(expected_warnings(program).items()):
            if not any("deprecated" in text and name in text for text in found.get(line, [])):
                said = "; ".join(found.get(line, [])) or "no warning"
                missing.append(f"  {program.name}:{line}: no deprecation warning naming {name} ({said})")
        if missing:
            print("FAIL: an old name compiles without the warning that names its replacement:")
            print("\n".join(missing))
            return 1
        print(f"ok: {program.name} compiles, each old name warned of with its new one")

        ran = subprocess.run([str(binary)], capture_output=True, text=True, errors="replace")
        print(ran.stdout + ran.stderr, end="")
        if ran.returncode != 0:
            print(f"FAIL: {program.name} exited {ran.returncode}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
