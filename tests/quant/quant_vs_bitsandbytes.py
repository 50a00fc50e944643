"""loom::quant against the libraries: NF4 against bitsandbytes 0.50.2, fp8 weight-only against torchao.

Random tensors of awkward shapes (numel not a multiple of the block, odd numel, an all-zero block, 1e4x
outliers, values on the code book's midpoints; bf16, fp16 and fp32) and the weights of a small Llama that
transformers saves are written to a safetensors file; tests/quant/quant_parity.cpp quantizes and
dequantizes each with loom and writes its parts back; this script compares:

- NF4 (bitsandbytes.functional.quantize_4bit(..., quant_type="nf4", compress_statistics=...) on the CPU):
  packed bytes equal; without double quantization the absmax equal; with it the offset and the
  statistics' absmax (state2.absmax) equal, and each 8-bit absmax code equal to bitsandbytes' CPU
  kernel's or, where that kernel's 65536-step lookup picks another, the code CUDA's dQuantize<0>
  gives (simulated here element by element), which must be a nearest code. The dequantized values
  equal, bit for bit, bitsandbytes' flat PyTorch path (backends/default/ops.py _dequantize_4bit_compute,
  eager) given loom's parts, with the absmax from bitsandbytes' dequantize_blockwise + offset.
- fp8: torchao's Float8WeightOnlyConfig formula (Float8Tensor.from_hp's "torch" kernel:
  torchao/quantization/quant_primitives.py _choose_scale_float8, _quantize_affine_float8,
  _dequantize_affine_float8), computed here in torch (torchao is not installed): scale = amax / 448 in
  the weight's dtype then fp32; values = (w.float() / scale).clamp(+-448).to(float8_e4m3fn);
  dequantized = values.float() * scale, then the dtype. loom's one difference, a zero scale clamped to
  the smallest normal float (torchao's torch path makes NaN of an all-zero row), is applied here too.
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import bitsandbytes
import bitsandbytes.functional as F
from bitsandbytes.backends.default import ops as default_ops

FAILURES = []


def fail(message):
    FAILURES.append(message)
    print("FAIL:", message)


def equal(name, what, loom, reference):
    if loom.shape != reference.shape or loom.dtype != reference.dtype:
        fail(f"{name}: {what}: loom's {tuple(loom.shape)} {loom.dtype}, the reference's "
             f"{tuple(reference.shape)} {reference.dtype}")
        return False
    # Bit for bit: the bytes.
    same = loom.contiguous().view(torch.uint8) == reference.contiguous().view(torch.uint8)
    if not bool(same.all()):
        count = int((~same).sum())
        fail(f"{name}: {what} differ in {count} of {same.numel()} bytes; first loom "
             f"{loom.reshape(-1)[:8].tolist()} vs {reference.reshape(-1)[:8].tolist()}")
        return False
    return True


def cuda_dquantize(code, x):
    """bitsandbytes' CUDA dQuantize<0> (csrc/kernels.cu), element by element, in fp32."""
    c = code.numpy().astype(np.float32)
    half = np.float32(0.5)
    out = np.empty(len(x), dtype=np.uint8)
    for k, value in enumerate(x.numpy().astype(np.float32)):
        pivot, upper_pivot, lower_pivot = 127, 255, 0
        lower, upper = np.float32(-1.0), np.float32(1.0)
        val = c[pivot]
        i = 64
        while i > 0:
            if value > val:
                lower_pivot, lower, pivot = pivot, val, pivot + i
            else:
                upper_pivot, upper, pivot = pivot, val, pivot - i
            val = c[pivot]
            i >>= 1
        if upper_pivot == 255:
            upper = c[upper_pivot]
        if lower_pivot == 0:
            lower = c[lower_pivot]
        if value > val:
            midpoint = np.float32((upper + val) * half)
            out[k] = upper_pivot if value > midpoint else pivot
        else:
            midpoint = np.float32((lower + val) * half)
            out[k] = lower_pivot if value < midpoint else pivot
    return torch.from_numpy(out)


def dequantize_reference(packed, absmax, block_size, shape, dtype):
    compute = getattr(default_ops._dequantize_4bit_compute, "__wrapped__", default_ops._dequantize_4bit_compute)
    code = F.get_4bit_type("nf4", device="cpu")
    return compute(packed.reshape(-1), absmax, code, block_size, list(shape), dtype)


def check_nf4(name, values, block_size, double_quant, loom, stats):
    packed, state = F.quantize_4bit(values, blocksize=block_size, compress_statistics=double_quant, quant_type="nf4")
    equal(name, "packed", loom[name + ".packed"], packed.reshape(-1))
    if not double_quant:
        equal(name, "absmax", loom[name + ".absmax"], state.absmax)
        absmax = loom[name + ".absmax"]
    else:
        equal(name, "absmax_offset", loom[name + ".absmax_offset"], state.offset.reshape(1))
        equal(name, "absmax_scale", loom[name + ".absmax_scale"], state.state2.absmax)
        codes = loom[name + ".absmax"]
        bnb_codes = state.absmax
        if codes.shape != bnb_codes.shape:
            fail(f"{name}: absmax codes {tuple(codes.shape)} vs bitsandbytes' {tuple(bnb_codes.shape)}")
            return
        # The codes CUDA's kernel gives for the same statistics.
        _, plain = F.quantize_4bit(values, blocksize=block_size, compress_statistics=False, quant_type="nf4")
        centred = plain.absmax - state.offset
        scale = state.state2.absmax
        blocks = centred.numel()
        per_value_scale = scale.repeat_interleave(256)[:blocks]
        x = centred * (1.0 / per_value_scale)
        expected = cuda_dquantize(state.state2.code, x)
        expected[per_value_scale == 0] = 0
        differ = codes != bnb_codes
        stats["statistics"] += blocks
        stats["cpu_lookup_differs"] += int(differ.sum())
        if not torch.equal(codes, expected):
            wrong = int((codes != expected).sum())
            fail(f"{name}: {wrong} absmax codes differ from CUDA's dQuantize<0>")
        # Where bitsandbytes' CPU lookup differs, loom's code is a nearest one.
        if bool(differ.any()):
            dm = state.state2.code
            distance = (x[differ].unsqueeze(1) - dm.unsqueeze(0)).abs()
            mine = distance.gather(1, codes[differ].long().unsqueeze(1)).squeeze(1)
            if not bool((mine <= distance.min(1).values).all()):
                fail(f"{name}: an absmax code where bitsandbytes' CPU kernel differs is not a nearest code")
        absmax = F.dequantize_blockwise(codes, state.state2)
        absmax += loom[name + ".absmax_offset"].reshape(())
        absmax = absmax.float()
        # Also bitsandbytes' own absmax for its own codes, through the same path.
        if not torch.equal(absmax, F.dequantize_blockwise(bnb_codes, state.state2) + state.offset) and not bool(
                differ.any()):
            fail(f"{name}: the absmax of equal codes differ")
    reference = dequantize_reference(loom[name + ".packed"], absmax, block_size, values.shape, values.dtype)
    equal(name, "dequantized values", loom[name + ".values"], reference)
    stats["nf4"] += 1


def fp8_reference(w, scaling):
    # torchao: amax in w's dtype, / 448 in w's dtype, then fp32 (loom: a zero scale clamped).
    if scaling == "row":
        amax = w.abs().amax(dim=tuple(range(1, w.dim())), keepdim=True)
    else:
        amax = w.abs().amax()
    scale = (amax / torch.finfo(torch.float8_e4m3fn).max).to(torch.float32)
    scale = scale.clamp(min=torch.finfo(torch.float32).tiny)
    data = (w.to(torch.float32) / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return data.view(torch.uint8), scale.reshape(-1), (data.to(torch.float32) * scale).to(w.dtype)


def check_fp8(name, w, scaling, loom, stats):
    values, scale, dequantized = fp8_reference(w, scaling)
    equal(name, "fp8 values", loom[name + ".fp8_values"], values)
    equal(name, "fp8 scale", loom[name + ".fp8_scale"], scale)
    equal(name, "fp8 dequantized values", loom[name + ".values"], dequantized)
    stats["fp8"] += 1


def random_cases(generator):
    """name -> (tensor, kind, options)."""
    cases = {}

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    shapes = [(7, 97), (64, 64), (3, 1000), (1, 65), (4096, ), (5, ), (130, 257)]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        tag = str(dtype).split(".")[-1]
        for shape in shapes:
            values = randn(*shape) * 0.05
            flat = values.view(-1)
            if flat.numel() > 256:
                flat[64:128] = 0  # an all-zero block
                flat[200] *= 1e4  # an outlier
                flat[-3] *= -1e4
            values = values.to(dtype)
            name = f"{tag}_{'x'.join(map(str, shape))}"
            for double_quant in (True, False):
                cases[f"{name}_dq{int(double_quant)}"] = (values, "nf4", (64, double_quant))
            if len(shape) == 2:
                cases[f"{name}_fp8row"] = (values, "fp8", "row")
            cases[f"{name}_fp8tensor"] = (values, "fp8", "tensor")
        for block_size in (32, 128, 256, 4096):
            values = (randn(11, 301) * 0.02).to(dtype)
            cases[f"{tag}_block{block_size}"] = (values, "nf4", (block_size, True))
    # Values on the NF4 midpoints (absmax 1): the decision tree's ties.
    code = F.get_4bit_type("nf4", device="cpu")
    midpoints = (code[:-1] + code[1:]) / 2
    ties = torch.cat([torch.ones(1), midpoints, -midpoints, torch.zeros(1)] * 4)
    cases["ties"] = (ties, "nf4", (64, False))
    cases["ties_dq"] = (ties, "nf4", (64, True))
    # All zeros: whole blocks, and a partial last one.
    cases["zeros_128"] = (torch.zeros(128), "nf4", (64, True))
    cases["zeros_100"] = (torch.zeros(100), "nf4", (64, True))
    cases["zeros_100_plain"] = (torch.zeros(100), "nf4", (64, False))
    # fp8: a zero row, a row at e4m3's ties, 3-D rows.
    w = randn(6, 40)
    w[2] = 0
    w[4, :8] = torch.tensor([448.0, 1.0625, 3.0625, -0.5625, 2.0**-9, 2.0**-10, 1e-30, -448.0])
    cases["fp8_zero_row"] = (w, "fp8", "row")
    cases["fp8_zero_row_bf16"] = (w.to(torch.bfloat16), "fp8", "row")
    cases["fp8_cube"] = (randn(4, 3, 5), "fp8", "row")
    return cases


def checkpoint_cases(folder):
    """A tiny Llama's weights, as transformers saves them."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    weights = load_file(os.path.join(folder, "model.safetensors"))
    cases = {}
    for name, tensor in sorted(weights.items()):
        key = "llama." + name
        cases[key + "_dq1"] = (tensor, "nf4", (64, True))
        if tensor.dim() == 2:
            cases[key + "_fp8row"] = (tensor, "fp8", "row")
    return cases


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--program", required=True, help="tests/quant's quant-parity")
    args = parser.parse_args()
    if bitsandbytes.__version__ != "0.50.2":
        print(f"bitsandbytes {bitsandbytes.__version__}, where the test is written for 0.50.2 (scripts/setup)")
        return 1
    generator = torch.Generator().manual_seed(60)
    with tempfile.TemporaryDirectory() as folder:
        cases = random_cases(generator)
        cases.update(checkpoint_cases(os.path.join(folder, "llama")))
        inputs, metadata = {}, {}
        for name, (tensor, kind, options) in cases.items():
            inputs[name] = tensor.contiguous().clone()
            if kind == "nf4":
                metadata[name + ".block_size"] = str(options[0])
                metadata[name + ".double_quant"] = "1" if options[1] else "0"
            else:
                metadata[name + ".fp8"] = options
        save_file(inputs, os.path.join(folder, "inputs.safetensors"), metadata=metadata)
        run = subprocess.run(
            [args.program, os.path.join(folder, "inputs.safetensors"),
             os.path.join(folder, "outputs.safetensors")], capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stdout, run.stderr)
            return 1
        loom = load_file(os.path.join(folder, "outputs.safetensors"))

    equal("tables", "the NF4 code book", loom["nf4_code_book"], F.get_4bit_type("nf4", device="cpu"))
    equal("tables", "the dynamic map", loom["dynamic_map"], F.create_dynamic_map(signed=True))
    stats = {"nf4": 0, "fp8": 0, "statistics": 0, "cpu_lookup_differs": 0}
    for name, (tensor, kind, options) in cases.items():
        if kind == "nf4":
            check_nf4(name, tensor, options[0], options[1], loom, stats)
        else:
            check_fp8(name, tensor, options, loom, stats)
    print(f"{stats['nf4']} NF4 and {stats['fp8']} fp8 tensors compared; {stats['statistics']} absmax statistics, "
          f"of which bitsandbytes' CPU lookup codes {stats['cpu_lookup_differs']} otherwise than CUDA's search")
    if FAILURES:
        print(f"{len(FAILURES)} failures")
        return 1
    print("loom's NF4 is bitsandbytes', its fp8 torchao's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
