#pragma once
// The clips wan-finetune reads, in either of two forms, the last tenth (at least one clip) held out:
// - a folder of loom's clip files (latent_clips.hpp, dsl_examples/data/make_wan_latents.py), each
//   batch a function of (seed, rank, index);
// - FastVideo's precomputed Parquet dataset as its preprocessing writes it (loom::data::
//   latent_parquet_dataset; dsl_examples/data/make_fastvideo_parquet.py), read in order with its
//   position in every checkpoint (state(), restore()).
// A folder holding any *.parquet file (in sub-folders too) is read as FastVideo's; a .parquet file too.

#include "latent_clips.hpp"

#include <loom/data/latent_parquet.hpp>
#include <loom/dsl/data_parallel.hpp>

#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace video_clips {

// Whether `data` is FastVideo's Parquet dataset rather than a folder of clip files.
inline bool is_parquet(const std::filesystem::path& data) {
  if (std::filesystem::is_regular_file(data)) return data.extension() == ".parquet";
  if (!std::filesystem::is_directory(data)) return false;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(data)) {
    if (entry.is_regular_file() && entry.path().extension() == ".parquet") return true;
  }
  return false;
}

// A batch of the Parquet dataset as latent_clips' batches are: fp32 tensors of their own.
inline latent_clips::batch as_tensors(loom::data::latent_batch rows) {
  return {torch::from_blob(rows.latents.data(), rows.latents_shape, at::kFloat).clone(),
          torch::from_blob(rows.text.data(), rows.text_shape, at::kFloat).clone()};
}

class source {
 public:
  // `described`: the data as the messages name it ("--data 'clips/'").
  source(const std::filesystem::path& data, std::uint64_t seed, loom::data_parallel_place place, std::int64_t batch,
         std::int64_t text_len, const std::string& described)
      : place_(place) {
    if (is_parquet(data)) {
      loom::data::latent_parquet_options options{.paths = {data},
                                                 .batch_size = batch,
                                                 .text_len = text_len,
                                                 .held_out_fraction = 0.1,
                                                 .seed = seed,
                                                 .rank = place.rank,
                                                 .world_size = place.world_size};
      training_rows_.emplace(options);
      // Every rank reads the held-out clips it evaluates by their rows (held_out_share).
      options.split = loom::data::latent_split::held_out;
      options.batch_size = 1;
      options.read_ahead = 0;
      options.rank = 0;
      options.world_size = 1;
      held_out_rows_.emplace(options);
      training_clips_ = static_cast<std::size_t>(training_rows_->rows());
      held_out_clips_ = static_cast<std::size_t>(held_out_rows_->rows());
      return;
    }
    const std::vector<std::filesystem::path> clips = latent_clips::clip_files(data);
    held_out_clips_ = std::max<std::size_t>(1, clips.size() / 10);
    training_clips_ = clips.size() - held_out_clips_;
    const auto split = clips.end() - static_cast<std::ptrdiff_t>(held_out_clips_);
    training_files_.emplace(std::vector<std::filesystem::path>(clips.begin(), split), seed, place.rank,
                            place.world_size, batch, text_len,
                            fmt::format("the clips of {} but its last tenth", described));
    held_out_files_.emplace(std::vector<std::filesystem::path>(split, clips.end()), seed, place.rank, place.world_size,
                            1, text_len, fmt::format("the last tenth of {}", described));
    first_file_ = clips.front();
    text_len_ = text_len;
  }

  [[nodiscard]] bool parquet() const noexcept { return training_rows_.has_value(); }
  [[nodiscard]] std::size_t training_clips() const noexcept { return training_clips_; }
  [[nodiscard]] std::size_t held_out_clips() const noexcept { return held_out_clips_; }

  // The first training clip, to check the model against.
  [[nodiscard]] latent_clips::batch first() const {
    if (parquet()) {
      latent_clips::batch clip = as_tensors(training_rows_->at(std::vector<std::int64_t>{0}));
      return {clip.latents[0], clip.text[0]};
    }
    return latent_clips::load_clip(first_file_, text_len_);
  }

  // Training batch `index` (from 0, micro-batches in order): clip files' drawn from (seed, index), the
  // Parquet dataset's next (a resumed run's position restored first).
  [[nodiscard]] latent_clips::batch next(std::int64_t index) {
    return parquet() ? as_tensors(training_rows_->next()) : training_files_->at(index);
  }

  // The held-out clips this rank evaluates: ⌈held out / ranks⌉, from its rank on in turn (a clip twice
  // where the ranks outnumber the clips), with their indices among the held-out clips.
  [[nodiscard]] std::pair<latent_clips::batch, std::vector<std::size_t>> held_out_share() const {
    if (!parquet()) return held_out_files_->held_out_share();
    const auto ranks = static_cast<std::size_t>(place_.world_size);
    const std::size_t share = (held_out_clips_ + ranks - 1) / ranks;
    std::vector<std::size_t> chosen;
    std::vector<std::int64_t> rows;
    for (std::size_t i = static_cast<std::size_t>(place_.rank); chosen.size() < share; i += ranks) {
      chosen.push_back(i % held_out_clips_);
      rows.push_back(static_cast<std::int64_t>(chosen.back()));
    }
    return {as_tensors(held_out_rows_->at(rows)), chosen};
  }

  // The Parquet dataset's position and identity, for loom::train's data_state, restore_data and
  // data_identity; none for clip files, whose batches follow from the step.
  [[nodiscard]] std::string state() const { return training_rows_->state(); }
  void restore(const std::string& state) { training_rows_->restore(state); }
  [[nodiscard]] std::string identity() const { return parquet() ? training_rows_->identity() : std::string(); }

 private:
  loom::data_parallel_place place_;
  std::optional<loom::data::latent_parquet_dataset> training_rows_, held_out_rows_;
  std::optional<latent_clips::sampler> training_files_, held_out_files_;
  std::filesystem::path first_file_;
  std::int64_t text_len_ = 0;
  std::size_t training_clips_ = 0, held_out_clips_ = 0;
};

}  // namespace video_clips
