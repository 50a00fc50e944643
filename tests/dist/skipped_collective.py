#!/usr/bin/env python3
"""A live rank that never issues a collective its peers wait on is named within LOOM_TIMEOUT_S
(docs/reliability.md): the failpoint collective.issue makes it skip one of 5 all-reduces, then every
rank computes for longer than the timeout. Its peers either block in the wait (host-waits, as on
Gloo) or wait on nothing on the host while the collective is unfinished (device-waits, as under
NCCL, whose wait() returns at once). A rank that is only slow to issue it, by less than the timeout
less the heartbeat's lead, is not named.

    skipped_collective.py LOOM_RUN SKIPPED_COLLECTIVE RANKS
"""
import os
import re
import sys

from hang_check import Checker

TIMEOUT_S = 10
COLLECTIVES = 5
SKIPPED = 3  # the third all-reduce: the skipping rank's later ones pair with its peers' earlier ones


def main() -> int:
    loom_run, program, ranks = sys.argv[1:4]
    world = int(ranks)
    # Rank 0 hosts the store: at 2 ranks it is the one that skips.
    late = 0 if world == 2 else 1
    waiting = [r for r in range(world) if r != late]
    waiters = f"rank {waiting[0]} waits" if len(waiting) == 1 else \
        "ranks " + ", ".join(map(str, waiting[:-1])) + f" and {waiting[-1]} wait"
    check = Checker(loom_run)
    base = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
    failpoint = dict(base, LOOM_TIMEOUT_S=str(TIMEOUT_S), LOOM_FAILPOINT="collective.issue",
                     LOOM_FAILPOINT_HIT=str(SKIPPED), LOOM_FAILPOINT_RANK=str(late))
    for mode in ("host-waits", "device-waits"):
        stderr = check.run(f"{mode}: rank {late} skips all-reduce #{SKIPPED} of {COLLECTIVES}, then every rank computes "
                           f"{3 * TIMEOUT_S} s", ranks, [program, mode, str(COLLECTIVES), str(3 * TIMEOUT_S)],
                           dict(failpoint, LOOM_FAILPOINT_SKIP="1"), bound_s=TIMEOUT_S + 5, at_fault=str(late),
                           expect=[rf"rank {late} has not issued collective #{COLLECTIVES}, all_reduce Float\[4\], "
                                   rf"which {waiters} on \(rank \d issued it [\d.]+ s ago; rank {late}'s last beat: "
                                   r"before the first pass\): it is stuck outside loom's collectives, or the ranks "
                                   r"issue different collectives"])
        ages = [float(age) for age in re.findall(r"issued it ([\d.]+) s ago", stderr)]
        if ages and max(ages) >= TIMEOUT_S:
            check.failures.append(f"{mode}: rank {late} was named {max(ages)} s after its peers issued the collective, "
                                  f"not within LOOM_TIMEOUT_S ({TIMEOUT_S} s)")

        check.run(f"{mode}: rank {late} issues all-reduce #{SKIPPED} 6 s late", ranks,
                  [program, mode, str(COLLECTIVES), "0"], dict(failpoint, LOOM_FAILPOINT_SLEEP_S="6"), bound_s=60,
                  expect_ok=True)
    for failure in check.failures:
        print("FAIL:", failure)
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
