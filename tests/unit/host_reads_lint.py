#!/usr/bin/env python3
"""Fails on a read of the device on the host outside the ledger (loom/runtime/host_reads.hpp).

.item(), .cpu() and .to(kCPU) each make the host wait for the device; loom routes every such read
through read_on_host (counted, and named by the hang check) or host_value (a value the host holds
already). A comment may name them.

usage: host_reads_lint.py ROOT
"""
import pathlib
import re
import sys

READS = re.compile(r"\.item\s*[<(]|\.cpu\s*\(\s*\)|\.to\(\s*(?:(?:at|c10|torch)::)?kCPU\b")
LEDGER = {"include/loom/runtime/host_reads.hpp", "src/runtime/host_reads.cpp"}


def code_of(line: str) -> str:
    """The line without its // comment (loom's sources keep no // inside a string that matters here)."""
    return line.split("//", 1)[0]


def main() -> int:
    root = pathlib.Path(sys.argv[1])
    found = []
    for folder in ("src", "include/loom"):
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in (".cpp", ".hpp") or path.relative_to(root).as_posix() in LEDGER:
                continue
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                if READS.search(code_of(line)):
                    found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    if found:
        print("host reads outside loom/runtime/host_reads.hpp: read a device tensor through read_on_host (counted "
              "in its part of the pass), or a host tensor's value through host_value")
        print("\n".join(found))
        return 1
    print("no host reads outside the ledger")
    return 0


if __name__ == "__main__":
    sys.exit(main())
