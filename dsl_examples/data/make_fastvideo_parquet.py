#!/usr/bin/env python3
"""Writes a dataset of precomputed clips in FastVideo's own Parquet format, as its preprocessing
(fastvideo/dataset/dataloader/schema.py's pyarrow_schema_t2v, parquet_io.py) writes it:
OUT/combined_parquet_dataset/worker_K/data_chunk_N.parquet, zstd, --rows-per-file rows a file, each
row a clip with `vae_latent_bytes` (the VAE's latents [C, F, H, W], raw little-endian float32 in C
order), `text_embedding_bytes` (the text encoder's states of the prompt's L tokens [L, D], unpadded),
their shapes and dtypes, and the clip's metadata. loom::data::latent_parquet_dataset reads it, and so
does FastVideo's training (docs/data.md, "FastVideo's Parquet datasets").

    make_fastvideo_parquet.py OUT [--clips 12] [--workers 2] [--rows-per-file 64] [--row-group-size N]
                                  [--channels 16] [--frames 3] [--height 8] [--width 8]
                                  [--text-dim 4096] [--max-tokens 16] [--seed 0] [--expected FILE]

Random clips, made to be learnable as make_wan_latents.py makes them: every clip's latents are one
shared pattern plus a little noise of its own. --expected writes every clip's values as JSON Lines
(its file, its row, its shapes and values), which tests/data compares loom's reading with.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

# fastvideo/dataset/dataloader/schema.py's pyarrow_schema_t2v, field for field.
SCHEMA_FIELDS = [
    ("id", "string"),
    ("vae_latent_bytes", "binary"),
    ("vae_latent_shape", "list<int64>"),
    ("vae_latent_dtype", "string"),
    ("text_embedding_bytes", "binary"),
    ("text_embedding_shape", "list<int64>"),
    ("text_embedding_dtype", "string"),
    ("file_name", "string"),
    ("caption", "string"),
    ("media_type", "string"),
    ("width", "int64"),
    ("height", "int64"),
    ("num_frames", "int64"),
    ("duration_sec", "double"),
    ("fps", "double"),
]


def t2v_schema():
    import pyarrow as pa

    types = {"string": pa.string(), "binary": pa.binary(), "list<int64>": pa.list_(pa.int64()),
             "int64": pa.int64(), "double": pa.float64()}
    return pa.schema([pa.field(name, types[kind]) for name, kind in SCHEMA_FIELDS])


def record(clip_id: str, latents, text, frames: int, height: int, width: int) -> dict:
    """A row as FastVideo's preprocessing makes it: ndarray.tobytes(), list(shape), str(dtype)."""
    return {
        "id": clip_id,
        "vae_latent_bytes": latents.tobytes(),
        "vae_latent_shape": list(latents.shape),
        "vae_latent_dtype": str(latents.dtype),
        "text_embedding_bytes": text.tobytes(),
        "text_embedding_shape": list(text.shape),
        "text_embedding_dtype": str(text.dtype),
        "file_name": f"{clip_id}.mp4",
        "caption": f"clip {clip_id}",
        "media_type": "video",
        "width": width * 8,
        "height": height * 8,
        "num_frames": (frames - 1) * 4 + 1,
        "duration_sec": ((frames - 1) * 4 + 1) / 16.0,
        "fps": 16.0,
    }


def write_file(rows: list[dict], path: Path, row_group_size: int | None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows, schema=t2v_schema())
    pq.write_table(table, path, compression="zstd", row_group_size=row_group_size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--clips", type=int, default=12)
    ap.add_argument("--workers", type=int, default=2, help="preprocessing workers: a worker_K folder each")
    ap.add_argument("--rows-per-file", type=int, default=64, help="FastVideo's samples_per_file")
    ap.add_argument("--row-group-size", type=int, default=None, help="rows a row group (default: a file's)")
    ap.add_argument("--channels", type=int, default=16)
    ap.add_argument("--frames", type=int, default=3)
    ap.add_argument("--height", type=int, default=8)
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--text-dim", type=int, default=4096, help="umT5-XXL's width (Wan's text encoder)")
    ap.add_argument("--max-tokens", type=int, default=16, help="the longest prompt, in tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--expected", type=Path, help="also write every clip's values here, as JSON Lines")
    args = ap.parse_args()

    import numpy as np

    rng = np.random.default_rng(args.seed)
    shape = (args.channels, args.frames, args.height, args.width)
    pattern = rng.standard_normal(shape, dtype=np.float32)
    root = args.out / "combined_parquet_dataset"
    # Worker k preprocesses clips k, k + workers, ...; each writes its clips rows_per_file at a time.
    expected = []
    for worker in range(args.workers):
        clips = list(range(worker, args.clips, args.workers))
        for chunk, start in enumerate(range(0, len(clips), args.rows_per_file)):
            path = root / f"worker_{worker}" / f"data_chunk_{chunk}.parquet"
            rows = []
            for row, clip in enumerate(clips[start:start + args.rows_per_file]):
                tokens = int(rng.integers(1, args.max_tokens + 1))
                latents = (pattern + 0.3 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
                text = rng.standard_normal((tokens, args.text_dim), dtype=np.float32)
                clip_id = f"clip-{clip:05d}"
                rows.append(record(clip_id, latents, text, args.frames, args.height, args.width))
                expected.append({"id": clip_id, "file": str(path.relative_to(args.out)), "row": row,
                                 "latent_shape": list(latents.shape), "latent": latents.ravel().tolist(),
                                 "text_shape": list(text.shape), "text": text.ravel().tolist()})
            write_file(rows, path, args.row_group_size)
    if args.expected:
        with open(args.expected, "w") as out:
            for each in expected:
                out.write(json.dumps(each) + "\n")
    print(f"{root}: {args.clips} clips from {args.workers} workers, latents {list(shape)}, "
          f"text states up to {args.max_tokens} × {args.text_dim}")


if __name__ == "__main__":
    main()
