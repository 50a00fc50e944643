#!/usr/bin/env python3
"""Writes one of FastVideo's Parquet files gone wrong, for test_latent_parquet.cpp: a good file's rows
(make_fastvideo_parquet.py's, latents [4, 2, 4, 4], text states [L, 16]) with one thing changed.

    fastvideo_parquet_cases.py CASE OUT.parquet

CASE: no-text-shape (the text_embedding_shape column missing), shape-as-string (vae_latent_shape a
string), short-bytes (row 1's vae_latent_bytes 100 bytes long), float16 (row 1's text states in
float16), other-shape (row 2's latents [4, 2, 4, 2]).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "dsl_examples" / "data"))
import make_fastvideo_parquet as fastvideo  # noqa: E402


def main() -> None:
    case, out = sys.argv[1], Path(sys.argv[2])
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(1)
    rows = [fastvideo.record(f"bad-{k}", rng.standard_normal((4, 2, 4, 4), dtype=np.float32),
                             rng.standard_normal((3, 16), dtype=np.float32), 2, 4, 4) for k in range(4)]
    schema = fastvideo.t2v_schema()
    if case == "no-text-shape":
        for row in rows:
            del row["text_embedding_shape"]
        schema = schema.remove(schema.get_field_index("text_embedding_shape"))
    elif case == "shape-as-string":
        for row in rows:
            row["vae_latent_shape"] = str(row["vae_latent_shape"])
        schema = schema.set(schema.get_field_index("vae_latent_shape"), pa.field("vae_latent_shape", pa.string()))
    elif case == "short-bytes":
        rows[1]["vae_latent_bytes"] = rows[1]["vae_latent_bytes"][:100]
    elif case == "float16":
        text = rng.standard_normal((3, 16)).astype(np.float16)
        rows[1].update(text_embedding_bytes=text.tobytes(), text_embedding_dtype=str(text.dtype))
    elif case == "other-shape":
        latents = rng.standard_normal((4, 2, 4, 2), dtype=np.float32)
        rows[2].update(vae_latent_bytes=latents.tobytes(), vae_latent_shape=list(latents.shape))
    else:
        sys.exit(f"fastvideo_parquet_cases.py: no case {case!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), out, compression="zstd")


if __name__ == "__main__":
    main()
