#!/usr/bin/env python3
"""wan-finetune on a Wan 2.2 A14B-shaped pipeline (two random experts split at boundary_ratio 0.5,
make_wan.py --experts) and random clips: both experts in one plan, one a step, the same on every rank.

- wan_finetune_check.py's run file (LoRA on FastVideo's targets, logit-normal timesteps, the weights'
  average, sampling at each evaluation);
- at 1 rank and at 2 (fsdp, hsdp_shard_dim 2) the run says how it splits the experts, the validation
  loss (each held-out clip under both experts, with the average of both) is logged and falls, each evaluation samples the
  held-out clip (the experts switched by the timestep, as WanPipeline switches them), and the run
  writes an adapter for each expert, both trained;
- a 2-rank run preempted (SIGTERM) and started again ends with both experts' adapters and the last
  evaluation's sample of an uninterrupted run, byte for byte: each step's expert is its own, whatever
  the restart;
- PEFT loads each expert's adapter onto that expert's WanTransformer3DModel, and it changes the velocity;
- --merged writes a pipeline's folder, each expert with its adapter folded in: diffusers' expert from it
  gives PEFT's with the adapter, and its model_index.json keeps the boundary;
- the samples' low-noise steps take sampling.guidance_scale_2 when given (at 1 rank), and the run says so;
- a run file's boundary_ratio (flow matching's or sampling's) other than the pipeline's is refused in a sentence.

    wan_experts_finetune_check.py LOOM_RUN WAN_FINETUNE SOURCE_DIR
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from preempted_run import preempted_and_resumed
from wan_finetune_check import RUN_FILE, distributed, losses, sampled

EXPERTS = ("transformer", "transformer_2")


def main() -> int:
    loom_run, recipe, source = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    data = source / "dsl_examples" / "data"
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="loom-wan-experts-") as scratch:
        root = Path(scratch)
        model, clips = root / "pipeline", root / "clips"
        subprocess.run([sys.executable, data / "make_wan.py", model, "--text-dim", "32", "--experts", "0.5"],
                       check=True)
        subprocess.run([sys.executable, data / "make_wan_latents.py", clips, "--text-dim", "32", "--clips", "10",
                        "--max-tokens", "6"], check=True)

        def command(ranks: int, out: Path, *extra: str) -> list[str]:
            config = out.with_suffix(".yaml")
            config.write_text(RUN_FILE.format(model=model, distributed=distributed(1, ranks), steps=12, decay=11))
            return [loom_run, "--nproc-per-node", str(ranks), "--", recipe, "--config", str(config), "--data",
                    str(clips), "--text-len", "8", f"--train.out={out}", *extra]

        from safetensors.torch import load_file

        for ranks in (1, 2):
            out = root / f"straight-{ranks}"
            # At 1 rank the low-noise expert's sampling steps are guided by a scale of their own.
            extra = ("--merged",) if ranks == 2 else ("--sampling.guidance_scale_2=2",)
            done = subprocess.run(command(ranks, out, *extra), capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stdout[-3000:], done.stderr[-3000:])
                return 1
            held_out = losses(out, "eval_loss")
            print(f"{ranks} rank(s): validation {held_out}")
            if len(held_out) != 3 or held_out[-1] >= held_out[0]:
                failures.append(f"at {ranks} rank(s) the validation loss was not logged at 4, 8, 12 or did not "
                                f"fall: {held_out}")
            guidance = "guidance_scale_2=2" if ranks == 1 else "guidance_scale_2=none"
            for said in ("experts: transformer at timesteps of at least 500, transformer_2 below; a step trains one",
                         f"{guidance}, boundary_ratio=0.5"):
                if said not in done.stdout:
                    failures.append(f"at {ranks} rank(s) the run did not say '{said}':\n{done.stdout[:2000]}")
            failures += sampled(out, ranks)
            for expert in EXPERTS:
                adapter = out / "adapter" / expert / "adapter_model.safetensors"
                if not adapter.is_file():
                    failures.append(f"at {ranks} rank(s) no adapter for {expert}: {adapter}")
                    continue
                # B starts at zero: an expert whose B moved was trained in some step.
                ups = [t for name, t in load_file(adapter).items() if "lora_B" in name]
                if not ups or all(t.abs().max().item() == 0 for t in ups):
                    failures.append(f"at {ranks} rank(s) {expert}'s adapter was never trained")

        straight, preempted = root / "straight-2", root / "preempted"
        failures += preempted_and_resumed(
            command(2, preempted), r"wan-finetune step +3/12", preempted, straight,
            same=tuple(f"adapter/{expert}/adapter_model.safetensors" for expert in EXPERTS) +
            ("validation/step-00000012/clip-0000.safetensors",))

        import torch
        from diffusers import WanTransformer3DModel
        from peft import PeftModel

        generator = torch.Generator().manual_seed(3)
        inputs = dict(hidden_states=torch.randn(1, 16, 3, 8, 8, generator=generator), timestep=torch.tensor([300]),
                      encoder_hidden_states=torch.randn(1, 8, 32, generator=generator), return_dict=False)
        for expert in EXPERTS:
            base = WanTransformer3DModel.from_pretrained(model / expert).eval()
            with torch.no_grad():
                before = base(**inputs)[0]
                after = PeftModel.from_pretrained(base, straight / "adapter" / expert).eval()(**inputs)[0]
                folded = WanTransformer3DModel.from_pretrained(straight / "merged" / expert).eval()(**inputs)[0]
            if (after - before).abs().max().item() <= 1e-4 * before.abs().max().item():
                failures.append(f"PEFT's {expert} with its adapter gives the base's velocity")
            # --merged: a pipeline's folder, each expert with its adapter folded in.
            if (folded - after).abs().max().item() > 1e-5 * after.abs().max().item():
                failures.append(f"merged/{expert} and PEFT's {expert} with its adapter differ")
        index = json.loads((straight / "merged" / "model_index.json").read_text())
        if index.get("boundary_ratio") != 0.5:
            failures.append(f"merged/model_index.json does not keep the pipeline's boundary_ratio: {index}")

        refusals = {
            "flow_matching.boundary_ratio is 0.875, but the pipeline":
                command(1, root / "other-boundary", "--flow_matching.boundary_ratio=0.875"),
            "sampling.boundary_ratio is 0.875, but the pipeline":
                command(1, root / "other-sampling-boundary", "--sampling.boundary_ratio=0.875"),
        }
        for sentence, refused_command in refusals.items():
            refused = subprocess.run(refused_command, capture_output=True, text=True)
            if refused.returncode == 0 or sentence not in refused.stdout + refused.stderr:
                failures.append(f"not refused with '{sentence}': {refused.stdout[-800:]}{refused.stderr[-800:]}")

    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
