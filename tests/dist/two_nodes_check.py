#!/usr/bin/env python3
"""Two nodes on one machine: two network namespaces joined by a veth pair, each running loom-run
with --nnodes 2 and 2 ranks. ddp(), fsdp() and hybrid sharding with one shard group a node
(fsdp({.shard_group_size = 2})) over the two nodes write the model that 4 ranks on one node write,
byte for byte: the ranks, their batches and Gloo's reduction order are the same, only the sockets
differ. The bytes on the link between the nodes are counted: under hybrid sharding no all-gather or
reduce-scatter crosses it, only the replicas' all-reduce of the reduced shards, so it carries well
under half of what fsdp() over every rank sends across it (about 2 against 6.5 model sizes a step). Then SIGKILL to node 1's launcher (it cannot forward anything; its ranks die
with it by PR_SET_PDEATHSIG) takes node 0's ranks and launcher down within --grace-s + 10 s, and no
process of the job is left on either node.

    two_nodes_check.py LOOM_RUN DEVICE_PARITY

Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2's `ip`; exits 77 (Meson's skip) with
the reason where the machine does not allow network namespaces. The namespaces and the veth pair are
created here and always removed; the addresses exist only inside them.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SKIP = 77
GRACE_S = 3
RANKS_PER_NODE = 2
STEPS = "10"
PORT = "29500"  # each namespace has its own ports: nothing else listens there


class Nodes:
    """Two namespaces, node 0 at 10.231.0.1 and node 1 at 10.231.0.2 on a veth pair."""

    def __init__(self) -> None:
        pid = os.getpid()
        self.names = [f"loom-node0-{pid}", f"loom-node1-{pid}"]
        self.links = [f"lm{pid}n0", f"lm{pid}n1"]  # at most 15 characters
        self.addresses = ["10.231.0.1", "10.231.0.2"]

    def create(self) -> None:
        for name in self.names:
            ip("netns", "add", name)
        ip("link", "add", self.links[0], "netns", self.names[0], "type", "veth", "peer", "name", self.links[1],
           "netns", self.names[1])
        for name, link, address in zip(self.names, self.links, self.addresses):
            ip("-n", name, "addr", "add", f"{address}/24", "dev", link)
            ip("-n", name, "link", "set", link, "up")
            ip("-n", name, "link", "set", "lo", "up")

    def pids(self, node: int) -> list[int]:
        found = subprocess.run(["ip", "netns", "pids", self.names[node]], capture_output=True, text=True)
        return [int(p) for p in found.stdout.split()]

    def remove(self) -> None:
        for node, name in enumerate(self.names):
            for pid in self.pids(node):  # only this test's processes live there
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", name], capture_output=True)  # takes its end of the veth pair

    def launch(self, node: int, loom_run: str, program: list[str], **popen) -> subprocess.Popen:
        # No GLOO_SOCKET_IFNAME: the host name resolves to 127.0.0.1 here, and loom must pick the veth's
        # address (the route to MASTER_ADDR) by itself.
        env = {k: v for k, v in os.environ.items() if k != "GLOO_SOCKET_IFNAME"}
        command = ["ip", "netns", "exec", self.names[node], loom_run, "--grace-s", str(GRACE_S), "--nnodes", "2",
                   "--node-rank", str(node), "--master-addr", self.addresses[0], "--master-port", PORT,
                   "--nproc-per-node", str(RANKS_PER_NODE), "--", *program]
        return subprocess.Popen(command, env=env, text=True, **popen)  # `ip netns exec` execs: its pid is loom-run's

    def link_bytes(self) -> int:
        """The bytes node 0's end of the veth pair has sent and received: everything between the nodes."""
        total = 0
        for counter in ("tx_bytes", "rx_bytes"):
            found = subprocess.run(["ip", "netns", "exec", self.names[0], "cat",
                                    f"/sys/class/net/{self.links[0]}/statistics/{counter}"],
                                   capture_output=True, text=True, check=True)
            total += int(found.stdout)
        return total

    def established_with(self, node: int, peer: int) -> int:
        found = subprocess.run(["ip", "netns", "exec", self.names[node], "ss", "-Htn", "state", "established", "dst",
                                self.addresses[peer]], capture_output=True, text=True)
        return len(found.stdout.splitlines())


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def parity(loom_run: str, program: str, nodes: Nodes, root: Path, strategy: str, crossed: dict[str, int]) -> list[str]:
    one, start = root / f"{strategy}-one-node.safetensors", root / f"{strategy}-start.safetensors"
    done = subprocess.run([loom_run, "--nproc-per-node", str(2 * RANKS_PER_NODE), "--", program, strategy, str(one),
                           STEPS, str(start)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        return [f"{strategy}: 4 ranks on one node failed (exit {done.returncode}): {done.stderr[-1500:]}"]
    two = root / f"{strategy}-two-nodes.safetensors"
    start = time.monotonic()
    before = nodes.link_bytes()
    launchers = [nodes.launch(node, loom_run, [program, strategy, str(two), STEPS], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for node in (0, 1)]
    outputs = [launcher.communicate(timeout=120) for launcher in launchers]
    took = time.monotonic() - start
    crossed[strategy] = nodes.link_bytes() - before
    failures = [f"{strategy}: node {node}'s loom-run exited {launcher.returncode}: {err[-1500:]}"
                for node, (launcher, (_, err)) in enumerate(zip(launchers, outputs)) if launcher.returncode != 0]
    if failures:
        return failures
    compared = subprocess.run([sys.executable, str(Path(__file__).parent.parent / "device" / "parity.py"), str(start),
                               str(one), str(two), "0"], capture_output=True, text=True)
    same = one.read_bytes() == two.read_bytes()
    print(f"{strategy}: 4 ranks on 2 nodes in {took:.1f} s against 4 on one node: "
          f"{'the same bytes' if same else 'DIFFERENT bytes'}; {compared.stdout.strip()}; "
          f"{crossed[strategy]} bytes between the nodes")
    failures = [] if same else [f"{strategy}: the two-node model differs from the one-node model: {compared.stdout}"]
    if strategy == "hsdp" and "fsdp: hybrid sharding: 2 shard groups of 2 ranks each" not in outputs[0][0]:
        failures.append(f"hsdp: rank 0's describe() does not name the shard groups: {outputs[0][0][-1500:]}")
    return failures


def kill_one_launcher(loom_run: str, program: str, nodes: Nodes, root: Path) -> list[str]:
    marker = root / "killed-run.safetensors"  # unique: it marks the job's processes
    launchers = [nodes.launch(node, loom_run, [program, "ddp", str(marker), "1000000"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT) for node in (0, 1)]
    # The process group is up once each node-0 rank holds its Gloo pair with each node-1 rank, besides
    # each node-1 rank's store connection; two seconds later the ranks are training. Killed earlier, node
    # 0 would wait in the rendezvous for LOOM_TIMEOUT_S, as it should, which is not this case.
    wanted = RANKS_PER_NODE * RANKS_PER_NODE + RANKS_PER_NODE
    deadline = time.monotonic() + 60
    while nodes.established_with(0, 1) < wanted:
        if time.monotonic() > deadline or any(launcher.poll() is not None for launcher in launchers):
            for launcher in launchers:
                launcher.kill()
            outputs = [launcher.communicate()[0] for launcher in launchers]
            return [f"kill: the job did not connect its ranks across the nodes within 60 s "
                    f"({nodes.established_with(0, 1)} of {wanted} connections): {outputs[0][-1500:]}"]
        time.sleep(0.2)
    time.sleep(2)
    killed = time.monotonic()
    launchers[1].send_signal(signal.SIGKILL)
    launchers[1].wait()
    failures = []
    try:
        output = launchers[0].communicate(timeout=GRACE_S + 60)[0]
    except subprocess.TimeoutExpired:
        launchers[0].kill()
        output = launchers[0].communicate()[0]
    took = time.monotonic() - killed
    last = last_line(output)
    print("\n".join(line for line in output.splitlines() if "loom" in line))
    print(f"kill: SIGKILL to node 1's loom-run; node 0's loom-run exited {launchers[0].returncode} after {took:.1f} s "
          f"(--grace-s {GRACE_S}); its last line: {last}")
    if took > GRACE_S + 10:
        failures.append(f"kill: node 0's loom-run took {took:.1f} s to end after node 1's was killed, more than "
                        f"--grace-s + 10 = {GRACE_S + 10} s:\n{output[-2000:]}")
    if launchers[0].returncode == 0 or "failed first" not in last:
        failures.append(f"kill: node 0's loom-run exited {launchers[0].returncode} with last line '{last}', expected "
                        f"a failure naming the rank that failed first:\n{output[-2000:]}")
    time.sleep(0.5)  # node 1's ranks die by PR_SET_PDEATHSIG: at once, but not synchronously
    for node in (0, 1):
        if left := nodes.pids(node):
            failures.append(f"kill: processes left on node {node}: {left}")
    found = subprocess.run(["pgrep", "-f", str(marker)], capture_output=True, text=True)
    if found.stdout.split():
        failures.append(f"kill: processes of the job left behind: {found.stdout.split()}")
    return failures


def main() -> int:
    loom_run, program = sys.argv[1], sys.argv[2]
    if shutil.which("ip") is None or shutil.which("ss") is None:
        print("SKIP: iproute2's ip and ss are not installed (apt-get install iproute2; scripts/setup does)")
        return SKIP
    nodes = Nodes()
    # Meson's timeout sends SIGTERM: leave through `finally`, which removes the namespaces.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("two_nodes_check: stopped by SIGTERM"))
    try:
        try:
            nodes.create()
        except subprocess.CalledProcessError as error:
            print(f"SKIP: this machine does not allow network namespaces and veth pairs here "
                  f"('{' '.join(error.cmd)}': {error.stderr.strip()}); the test needs root "
                  f"(CAP_SYS_ADMIN and CAP_NET_ADMIN)")
            return SKIP
        failures = []
        crossed: dict[str, int] = {}
        with tempfile.TemporaryDirectory() as root:
            for strategy in ("ddp", "fsdp", "hsdp"):
                failures += parity(loom_run, program, nodes, Path(root), strategy, crossed)
            if "fsdp" in crossed and "hsdp" in crossed and crossed["hsdp"] > 0.5 * crossed["fsdp"]:
                failures.append(f"hsdp: {crossed['hsdp']} bytes crossed between the nodes, more than half of fsdp()'s "
                                f"{crossed['fsdp']}: a shard group's collectives cross the nodes")
            failures += kill_one_launcher(loom_run, program, nodes, Path(root))
    finally:
        nodes.remove()
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
