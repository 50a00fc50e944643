#!/usr/bin/env python3
"""A rank killed in the middle of a collective: every survivor must end with loom's error, naming
the rank that is gone, within a bound, and never through std::terminate (SIGABRT).

    peer_death.py PROGRAM RANKS last-rank|rank0|waiting-on-a-failed-rank

Starts RANKS processes of a scenario of PROGRAM (tests/dist/failures.cpp) with the variables torchrun
sets, but without a launcher, which would stop the survivors itself as soon as one rank died. In
`VICTIM-killed-in-backward` the victim (the last rank, or rank 0, which hosts the rendezvous store)
kills itself with SIGKILL mid-backward; in `waiting-on-a-failed-rank` rank 1 dies and the survivors
live on after their error, so that a wait on a survivor must end by its broken connections, not by
its exit. Each survivor checks its own message and time (exit code 0), and this driver checks how
every process ended.
"""
import os
import signal
import socket
import subprocess
import sys
import time

BOUND_S = 30  # the survivors' own bound is 10 s from their first collective; this covers start-up


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    program, ranks, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if mode == "waiting-on-a-failed-rank":
        scenario, victim, linger_s = mode, 1, 12  # longer than a survivor's own 10 s bound
    else:
        scenario, victim, linger_s = f"{mode}-killed-in-backward", 0 if mode == "rank0" else ranks - 1, 0
    bound_s = BOUND_S + linger_s
    port = free_port()
    processes = []
    for rank in range(ranks):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks),
                   LOCAL_WORLD_SIZE=str(ranks), GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   LOOM_TIMEOUT_S="20", LOOM_TEST_LINGER_S=str(linger_s))
        processes.append(subprocess.Popen([program, scenario], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
    start = time.monotonic()
    failures = []
    for rank, process in enumerate(processes):
        try:
            output, _ = process.communicate(timeout=max(1, bound_s - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            for p in processes:
                p.kill()
            sys.exit(f"FAILED: rank {rank} still running after {bound_s} s: a hang")
        code = process.returncode
        print(f"--- rank {rank}: exit {code} after {time.monotonic() - start:.1f} s\n{output.rstrip()}")
        if rank == victim:
            if code != -signal.SIGKILL:
                failures.append(f"rank {rank} should have died by SIGKILL, got exit {code}")
        elif code != 0:
            how = "std::terminate (SIGABRT)" if code == -signal.SIGABRT else f"exit {code}"
            failures.append(f"survivor rank {rank} ended with {how}, not with loom's expected error")
        elif rank == 0 and f"rank {victim} fell silent" not in output:
            failures.append(f"rank 0, which hosts the store, did not name rank {victim} as the one that fell silent")
    if failures:
        sys.exit("FAILED: " + "; ".join(failures))
    print(f"every survivor of {ranks} ranks ended with loom's error naming the lost rank")


if __name__ == "__main__":
    main()
