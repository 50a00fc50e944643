#pragma once
// loom::data::latent_parquet_dataset: FastVideo's precomputed video datasets read as they are, with no
// conversion: the Parquet files its preprocessing writes (OUT/combined_parquet_dataset/worker_K/
// data_chunk_N.parquet, fastvideo/dataset/dataloader/schema.py's pyarrow_schema_t2v; I2V's extra
// columns are left unread), each row a clip: `vae_latent_bytes` [C, F, H, W] and `text_embedding_bytes`
// [L, D], raw little-endian float32 in C order, with their shapes and dtypes. Files are found under the
// paths recursively and taken in the order of their full paths, as FastVideo lists them, and their rows
// in file order: a row's index is its place in that order. The text states are padded with zeros (or
// cut) to text_len, with a mask of the real tokens, as FastVideo's dataloader pads them.
//
// Each epoch the row groups are shuffled by (seed, epoch), and the rows inside each row group; data-
// parallel rank r of W takes the r-th of W consecutive runs of that order (sizes differing by one at
// most): no two ranks read the same row, together they read every row once an epoch, and each rank reads
// about 1/W of the row groups, whole. Batches run on across epochs (a batch may end one epoch and start
// the next), so no row is dropped or doubled. Row groups are read and decoded ahead on a thread of the
// dataset's own, read_ahead of them at most.
//
// Its position (the epoch and the rows this rank has read in it) is state(), a JSON text that restore()
// takes back: a dataset restored from the state after batch n gives what an uninterrupted one gives
// from n + 1 on. A bad file or row is refused in one sentence naming the file, the row group and the row.
//
// Torch-free, like the rest of loom::data: a batch is fp32 values and their shapes, which
// at::from_blob takes as they are.

#include <loom/dsl/options.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

namespace loom::data {

// Which rows a dataset reads: all but the last held-out ones, or those.
enum class latent_split { train, held_out };
[[nodiscard]] std::string_view name_of(latent_split split) noexcept;
constexpr std::array<latent_split, 2> values_of(std::type_identity<latent_split>) noexcept {
  return {latent_split::train, latent_split::held_out};
}

struct latent_parquet_options {
  // Parquet files, or folders whose *.parquet files (in sub-folders too) are read.
  std::vector<std::filesystem::path> paths{};
  std::int64_t batch_size = 1;
  // The text states' length in a batch: FastVideo's text_padding_length.
  std::int64_t text_len = 512;
  // The last ⌊held_out_fraction × rows⌋ rows (at least one, when it is above 0) are held out from
  // training: wan-finetune holds out a tenth.
  double held_out_fraction = 0.0;
  latent_split split = latent_split::train;
  std::uint64_t seed = 0;
  bool shuffle = true;  // false: the rows in order, every epoch
  // Row groups read and decoded ahead of the batches, on a thread; 0 reads on the caller's thread.
  std::int64_t read_ahead = 2;
  int rank = 0;        // data-parallel: job.data_rank()
  int world_size = 1;  // job.data_world_size()

  static constexpr auto fields() {
    return std::tuple{option_field{"text_len", &latent_parquet_options::text_len},
                      option_field{"held_out_fraction", &latent_parquet_options::held_out_fraction},
                      option_field{"shuffle", &latent_parquet_options::shuffle},
                      option_field{"read_ahead", &latent_parquet_options::read_ahead, option_role::layout}};
  }
};

// A batch of B clips, fp32 in C order, shaped as dsl_examples' latent_clips batches are.
struct latent_batch {
  std::vector<float> latents;  // [B, C, F, H, W]: the VAE's latents
  std::array<std::int64_t, 5> latents_shape{};
  std::vector<float> text;  // [B, text_len, D]: padded with zeros, or cut
  std::array<std::int64_t, 3> text_shape{};
  std::vector<std::uint8_t> text_mask;  // [B, text_len]: 1 on a clip's tokens, 0 on its padding
  std::vector<std::int64_t> rows;       // each clip's row, counted from the split's first
  std::vector<std::string> ids;         // each clip's `id`
};

class latent_parquet_dataset {
 public:
  // Lists the files and reads their footers (the schema, the row groups), not their rows. Throws
  // std::invalid_argument, in one sentence, for options or data that cannot work: no files, a file
  // that is not Parquet or lacks FastVideo's columns, fewer rows than ranks.
  explicit latent_parquet_dataset(latent_parquet_options options);
  latent_parquet_dataset(latent_parquet_dataset&&) noexcept;
  latent_parquet_dataset& operator=(latent_parquet_dataset&&) noexcept;
  ~latent_parquet_dataset();

  // This rank's next batch_size clips, going on into the next epoch, reshuffled. A row whose shapes,
  // dtypes or bytes are wrong, or whose latents' shape or text width differs from the batch's first,
  // is refused naming it (std::invalid_argument); a file gone or truncated since, std::runtime_error.
  [[nodiscard]] latent_batch next();

  // The clips of `rows` (counted from the split's first), in that order, read now on the caller's
  // thread: the held-out clips a rank evaluates, or a first clip to check a model against.
  [[nodiscard]] latent_batch at(std::span<const std::int64_t> rows) const;

  [[nodiscard]] std::string state() const;
  // Throws std::invalid_argument for a state of other files, options or ranks, naming what differs.
  void restore(std::string_view state);

  // What the data is, for loom::train's data_identity: the files' paths under the folder given, their
  // sizes and a digest of their Parquet footers (which hold every column chunk's place, size and
  // statistics: the rows themselves are too many gigabytes to hash at every start), "worker_0/
  // data_chunk_0.parquet, ... (3 files, 5120 bytes, digest 3c1e…)"; the same on every rank.
  [[nodiscard]] const std::string& identity() const noexcept;
  [[nodiscard]] std::int64_t epoch() const noexcept;          // of the next clip next() gives
  [[nodiscard]] std::int64_t rows() const noexcept;           // in the split, on all ranks
  [[nodiscard]] std::int64_t rank_rows() const noexcept;      // this rank's share of an epoch
  [[nodiscard]] std::int64_t held_out_rows() const noexcept;  // at the end, whichever the split

  struct impl;

 private:
  std::unique_ptr<impl> core_;
};

}  // namespace loom::data
