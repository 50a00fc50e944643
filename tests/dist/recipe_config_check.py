"""tiny-gpt's phase 2 from a run file: each of dsl_examples/configs/tiny-gpt-adapt-*.toml runs, at 3
ranks, with dotted overrides, and describes the plan it read; a run file or command line that
cannot work stops the recipe before phase 1 trains, with one sentence and the exit code a user
expects (2 for the command line, 1 for the plan).

    recipe_config_check.py LOOM_RUN TINY_GPT CONFIG_DIR
"""
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> int:
    loom_run, tiny_gpt, configs = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    failures = []
    # The schedules are fractions of train.steps: fewer steps need no other override.
    short = ["--train.steps=4", "--train.eval_every=2", "--train.log_every=2", "--train.checkpoint_every=2"]
    with tempfile.TemporaryDirectory() as out:
        for config, strategy in (("tiny-gpt-adapt-fsdp.toml", "fsdp("), ("tiny-gpt-adapt-ddp.toml", "ddp("),
                                 ("tiny-gpt-adapt-bf16-fsdp.toml", "mixed_precision(param=bf16, reduce=fp32")):
            done = subprocess.run([loom_run, "--nproc-per-node", "3", "--", tiny_gpt, "--steps-pretrain", "4",
                                   "--out", out, "--config", str(configs / config), *short, "--lora.rank=2"],
                                  capture_output=True, text=True, timeout=240)
            text = done.stdout
            if done.returncode != 0:
                failures.append(f"{config}: exit {done.returncode}\n{text[-1500:]}{done.stderr[-1500:]}")
                continue
            if "lora(rank=2" not in text or strategy not in text:
                failures.append(f"{config}: the plan read from the file (rank 2, {strategy}...) is not described")
            if "adapt step     4/4" not in text or "adapt eval at step 4/4" not in text:
                failures.append(f"{config}: phase 2 did not run the file's 4 steps with evaluation")
            if not (Path(out) / f"adapt-{Path(config).stem}" / "adapter" / "adapter_config.json").exists():
                failures.append(f"{config}: no adapter was saved in the run file's own folder")
            if (Path(out) / "adapter").exists():
                failures.append(f"{config}: an adapter was saved outside the run file's own folder")
            for folder in (f"adapt-{Path(config).stem}", "adapter", "adapted"):  # phase 1 stays: the next reuses it
                subprocess.run(["rm", "-rf", str(Path(out) / folder)], check=True)

    fsdp = str(configs / "tiny-gpt-adapt-fsdp.toml")
    for words, code, sentence in (
            (["--config", fsdp, "--lora.rank=0"], 1, "loom R5: lora rank must be > 0"),
            (["--config", fsdp, "--strategy=zero3"], 1, "unknown strategy 'zero3'"),
            (["--config", fsdp, "--train.stesp=3"], 1, "train.stesp: unknown key"),
            (["--config", fsdp, "--steps-adapt", "5"], 2, "--steps-adapt excludes --config"),
            (["--lora.rank=4"], 2, "lora.rank=4 overrides a run file: give --config FILE"),
            (["--steps-pretrain", "0"], 2, "--steps-pretrain"),
            (["--out", "/proc/loom-cannot-be-here"], 1, "--out /proc/loom-cannot-be-here cannot be created")):
        refused = subprocess.run([tiny_gpt, *words], capture_output=True, text=True, timeout=60)
        if refused.returncode != code or sentence not in refused.stderr or "phase 1" in refused.stdout:
            failures.append(f"tiny-gpt {words}: exit {refused.returncode}, wanted {code} and '{sentence}' before "
                            f"training:\n{refused.stderr[-600:]}")
    for program in (tiny_gpt, loom_run):
        helped = subprocess.run([program, "--help"], capture_output=True, text=True)
        if helped.returncode != 0 or "--" not in helped.stdout:
            failures.append(f"{program} --help: exit {helped.returncode}")

    for failure in failures:
        print("FAIL:", failure)
    print("recipe config:", "ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
