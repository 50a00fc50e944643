"""bench/gpu_hf_anchor.py's model FLOPs, which gpu_summary.py turns into both sides' MFU on a GPU: grouped-query
attention is counted as the attention it broadcasts to, on any torch. The torch of the GPU machine may predate
pytorch/pytorch#177169, whose flop counter stopped with an AssertionError on a key with fewer heads than the
query (Llama's 2 key-value heads for 4); that torch is stood in for by a counter with the old, strict check.
"""
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils import flop_counter

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import gpu_hf_anchor  # noqa: E402

BATCH, SEQ, HEAD_DIM = 2, 48, 16


def attention_step(query_heads: int, kv_heads: int, formulas: dict | None) -> int:
    """The FLOPs counted for one attention's forward and backward, causal, on the CPU's fused kernel."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(BATCH, query_heads, SEQ, HEAD_DIM, generator=gen, requires_grad=True)
    k = torch.randn(BATCH, kv_heads, SEQ, HEAD_DIM, generator=gen, requires_grad=True)
    v = torch.randn(BATCH, kv_heads, SEQ, HEAD_DIM, generator=gen, requires_grad=True)
    with flop_counter.FlopCounterMode(display=False, custom_mapping=formulas or {}) as counter:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads != query_heads)
        out.sum().backward()
    return counter.get_total_flops()


def strict(count):
    """`count` with the check torch's counter made before #177169: as many key and value heads as query heads."""

    def checked(query_shape, key_shape, value_shape):
        assert query_shape[1] == key_shape[1] == value_shape[1], "query/key/value shapes are incompatible"
        return count(query_shape, key_shape, value_shape)

    return checked


def main() -> int:
    formulas = gpu_hf_anchor.attention_formulas()
    cpu_kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    assert cpu_kernel in formulas, "the CPU's fused attention must be counted too"

    # Forward: 2 products of SEQ x SEQ x HEAD_DIM per head; backward: 5 (scores recomputed, dV, dP, dQ, dK).
    expected = 2 * BATCH * 4 * SEQ * SEQ * HEAD_DIM * (2 + 5)
    mha = attention_step(4, 4, formulas)
    gqa = attention_step(4, 2, formulas)
    assert mha == expected, f"multi-head attention counted {mha} FLOPs, not {expected}"
    assert gqa == expected, f"grouped-query attention counted {gqa} FLOPs, not {expected} (its query's heads)"

    unchecked = flop_counter.sdpa_flop_count
    flop_counter.sdpa_flop_count = strict(unchecked)
    try:
        counted = attention_step(4, 2, formulas)
        assert counted == expected, f"under the strict counter, grouped-query attention counted {counted}"
    finally:
        flop_counter.sdpa_flop_count = unchecked
    print(f"attention of {BATCH} x 4 heads x {SEQ} tokens: {expected} FLOPs, with 4 or 2 key-value heads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
