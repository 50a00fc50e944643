#!/usr/bin/env python3
"""A run folder under loom::train (dist-run-folder, LoRA over a pretrained TinyGpt, a text dataset):

--part trained-over: what a checkpoint was trained over.
- the same base and data resume as before;
- the base remade from another seed (the same names and shapes, other values) is refused on every
  rank in one sentence naming the checkpoint, both digests and what to do, and nothing is trained;
- train.resume_over_changes resumes it, and rank 0 says so;
- a data file changed in place (the same size) is refused, naming the data both ways;
- a checkpoint saved before checkpoints recorded them resumes, saying it is not checked.

--part run-folder-lock: one job a run folder.
- a lock whose holder runs (this script) refuses the job on every rank, naming the holder, and
  leaves the folder as it was (an unfinished checkpoint of the holder's stays);
- a lock on another host is refused, saying whether it runs cannot be seen there;
- a lock whose holder is gone is taken over, saying so;
- a run releases the lock, and the same command resumes.

    run_folder_check.py --loom-run LOOM_RUN --program DIST_RUN_FOLDER --ranks N --strategy S --part P
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path


def write_documents(folder: Path) -> None:
    folder.mkdir(parents=True)
    for k in range(2):
        lines = [json.dumps({"text": f"{k}:{i}:" + "abcdefghij"[i % 10:] * 3}) for i in range(20)]
        (folder / f"part-{k}.jsonl").write_text("\n".join(lines) + "\n")


class Runner:
    def __init__(self, args, work: Path):
        self.args = args
        self.work = work
        self.base = work / "base"
        self.data = work / "data"
        self.out = work / "run"

    def make_base(self, seed: int) -> None:
        subprocess.run([self.args.program, "base", str(seed), str(self.base)], check=True)

    def train(self, steps: int, *extra: str) -> subprocess.CompletedProcess:
        command = [self.args.loom_run, "--nproc-per-node", str(self.args.ranks), "--", self.args.program, "train",
                   self.args.strategy, str(self.base), str(self.data), str(self.out), str(steps), *extra]
        return subprocess.run(command, capture_output=True, text=True)


def fail(what: str, result: subprocess.CompletedProcess | None = None) -> None:
    print(f"FAIL: {what}")
    if result is not None:
        print(f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}")
    sys.exit(1)


def expect(result: subprocess.CompletedProcess, code: int, what: str) -> str:
    if (result.returncode == 0) != (code == 0):
        fail(f"{what}: exit {result.returncode}, expected {'0' if code == 0 else 'a failure'}", result)
    return result.stdout + result.stderr


def rank_lines(output: str, pattern: str) -> list[str]:
    """The lines that match `pattern`: each rank says its error on a line of its own."""
    return [line for line in output.splitlines() if re.search(pattern, line)]


def trained_over(runner: Runner, ranks: int) -> None:
    runner.make_base(1)
    write_documents(runner.data)
    result = runner.train(4)
    if "records nothing" in expect(result, 0, "the first run"):
        fail("a new checkpoint says it records nothing of what it was trained over", result)

    result = runner.train(6)
    output = expect(result, 0, "the same base and data")
    if "resumed from" not in output or "trained over" in output:
        fail("the same base and data did not resume quietly", result)

    runner.make_base(2)  # the same names and shapes, other values
    result = runner.train(8)
    output = expect(result, 1, "a reseeded base")
    sentence = (r"the checkpoint '[^']*step-00000006' was trained over other pretrained weights than this run's: "
                r"it was trained over the pretrained weights '[^']*base' \(digest ([0-9a-f]{16})\), and this run's "
                r"'[^']*base' are others \(digest ([0-9a-f]{16})\); to start this run afresh, give it a folder of "
                r"its own \(loom::train's out; --train\.out=DIR with a run file\) or remove '[^']*checkpoints', or "
                r"to resume over this run's anyway set loom::train's resume_over_changes")
    found = rank_lines(output, sentence)
    if len(found) < ranks:
        fail(f"the refusal of a reseeded base is not said on every rank ({len(found)} of {ranks})", result)
    match = re.search(sentence, found[0])
    if match.group(1) == match.group(2):
        fail("the refusal names the same digest twice", result)
    if "resumed from" in output or (runner.out / "checkpoints" / "step-00000008").exists():
        fail("a reseeded base was trained on", result)

    result = runner.train(8, "resume-over-changes")
    output = expect(result, 0, "resume_over_changes")
    if "resumed from" not in output or not re.search(
            r"was trained over other pretrained weights than this run's: .*; resume_over_changes is set, so it "
            r"resumes over this run's nonetheless", output):
        fail("resume_over_changes did not resume saying so", result)

    # One letter of a document changed in place: the file keeps its size.
    part = runner.data / "part-1.jsonl"
    text = part.read_text()
    part.write_text(text.replace("abc", "abd", 1))
    result = runner.train(10)
    output = expect(result, 1, "a data file changed in place")
    data = (r"the checkpoint '[^']*step-00000008' was trained over other data than this run's: it was trained over "
            r"the data part-0\.jsonl, part-1\.jsonl \(2 files, \d+ bytes, digest ([0-9a-f]{16})\), and this run reads "
            r"part-0\.jsonl, part-1\.jsonl \(2 files, \d+ bytes, digest ([0-9a-f]{16})\); to start this run afresh")
    if len(rank_lines(output, data)) < ranks:
        fail("the refusal of a changed data file is not said on every rank", result)

    # A checkpoint saved before loom recorded what it was trained over (here as a manifest of sizes
    # only, which needs no checksum of its own) resumes unchecked, saying so.
    manifest_file = runner.out / "checkpoints" / "step-00000008" / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    del manifest["trained_over"], manifest["manifest_xxh3"]
    manifest["format"] = "loom checkpoint v1"
    manifest["files"] = {name: entry["bytes"] for name, entry in manifest["files"].items()}
    manifest_file.write_text(json.dumps(manifest, indent=2))
    result = runner.train(10)
    output = expect(result, 0, "a checkpoint saved before it recorded what it was trained over")
    if "resumed from" not in output or not re.search(
            r"the checkpoint '[^']*step-00000008' records nothing of the pretrained weights and the data it was "
            r"trained over \(loom [^ ]+ saved it, before checkpoints recorded them\), so it resumes without that "
            r"check", output):
        fail("an older checkpoint did not resume with a note", result)


def lock_text(host: str, pid: int, since: str = "2025-01-01 00:00:00 UTC", job: str = "") -> str:
    stat = Path(f"/proc/{pid}/stat").read_text() if Path(f"/proc/{pid}/stat").exists() else ""
    started = int(stat[stat.rfind(")") + 1:].split()[19]) if stat else 0
    return json.dumps({"host": host, "pid": pid, "process_start": started, "since": since, "job": job}, indent=2)


def run_folder_lock(runner: Runner, ranks: int) -> None:
    runner.make_base(1)
    write_documents(runner.data)
    lock = runner.out / "loom.lock"
    host = socket.gethostname()

    # A job that runs: this script, with an unfinished checkpoint that a second job must not remove.
    partial = runner.out / "checkpoints" / "step-00000040.tmp"
    partial.mkdir(parents=True)
    (partial / "manifest.json.tmp").write_text("{}")
    held = lock_text(host, os.getpid(), job="rank 0 of 2 ranks at 127.0.0.1:29511")
    lock.write_text(held)
    result = runner.train(4)
    output = expect(result, 1, "a second job on a folder in use")
    sentence = (rf"train: the run folder '[^']*run' is in use by another job: pid {os.getpid()} on host '{re.escape(host)}' "
                r"\(rank 0 of 2 ranks at 127\.0\.0\.1:29511\) holds it since 2025-01-01 00:00:00 UTC; give this run "
                r"another out folder \(loom::train's out; --train\.out=DIR with a run file\), or wait for that job to end")
    if len(rank_lines(output, sentence)) < ranks:
        fail("the second job is not refused on every rank with the sentence", result)
    if lock.read_text() != held or not (partial / "manifest.json.tmp").exists():
        fail("the refused job touched the folder", result)

    lock.write_text(lock_text("elsewhere.example", 4242))
    result = runner.train(4)
    output = expect(result, 1, "a lock held on another host")
    if len(rank_lines(output, r"is in use by another job: pid 4242 on host 'elsewhere\.example' holds it since "
                                     r"2025-01-01 00:00:00 UTC, on a host where this one cannot see whether it still "
                                     r"runs; .*or remove '[^']*loom\.lock' if that job is gone")) < ranks:
        fail("a lock on another host is not refused with the sentence", result)

    gone = subprocess.Popen(["true"])
    gone.wait()
    lock.write_text(lock_text(host, gone.pid))
    result = runner.train(4)
    output = expect(result, 0, "a lock whose holder is gone")
    if not re.search(rf"train: the run folder '[^']*run' was locked by pid {gone.pid} on host '{re.escape(host)}' since "
                     r"2025-01-01 00:00:00 UTC, which no longer runs: this job takes the lock over", output):
        fail("the stale lock was not taken over saying so", result)
    if lock.exists():
        fail("the lock was not released at the end of the run", result)

    result = runner.train(6)
    output = expect(result, 0, "the same command again")
    if "resumed from" not in output or "takes the lock over" in output or lock.exists():
        fail("the same command did not resume in the released folder", result)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loom-run", required=True)
    parser.add_argument("--program", required=True)
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--part", choices=["trained-over", "run-folder-lock"], required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        runner = Runner(args, Path(work))
        if args.part == "trained-over":
            trained_over(runner, args.ranks)
        else:
            run_folder_lock(runner, args.ranks)
    print("ok")


if __name__ == "__main__":
    main()
