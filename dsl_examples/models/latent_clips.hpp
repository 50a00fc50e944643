#pragma once
// Precomputed clips for a video DiT (wan-finetune): a folder of safetensors files, one a clip, as
// dsl_examples/data/make_wan_latents.py writes them, with FastVideo's preprocessing's names and
// shapes: `vae_latent` [C, F, H, W], the VAE's latents as the DiT takes them, and `text_embedding`
// [L, D], the text encoder's states of the prompt's L tokens, padded here with zeros (or cut) to
// the text length, as FastVideo's dataloader pads them. Files are taken in the order of their names;
// the last tenth (at least one) is held out. Each rank's batches follow from (seed, rank, epoch,
// step), as text_data's do, so a resumed run draws the clips it would have drawn.

#include <loom/io/safetensors.hpp>

#include <torch/torch.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace latent_clips {

// The latents [B, C, F, H, W] and text states [B, text_len, D] of a batch, fp32.
struct batch {
  at::Tensor latents;
  at::Tensor text;
};

// The clip files of `folder`, in the order of their names; refused in one sentence when there are
// too few to hold one out.
inline std::vector<std::filesystem::path> clip_files(const std::filesystem::path& folder) {
  if (!std::filesystem::is_directory(folder)) {
    throw std::invalid_argument(fmt::format(
        "--data '{}' is not a folder: give the folder of clips make_wan_latents.py writes", folder.string()));
  }
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  if (files.size() < 2) {
    throw std::invalid_argument(
        fmt::format("--data '{}' has {} clip files (*.safetensors): give at least 2, one to "
                    "train on and one to hold out",
                    folder.string(), files.size()));
  }
  return files;
}

namespace detail {

// The `dims`-dimensional tensor `name` of a clip file's `content`, fp32; refused naming the file.
inline at::Tensor clip_tensor(const loom::safetensors_content& content, const std::filesystem::path& file,
                              const std::string& name, std::int64_t dims) {
  const auto found = std::find_if(content.tensors.begin(), content.tensors.end(),
                                  [&](const loom::named_tensor& each) { return each.name == name; });
  if (found == content.tensors.end() || found->tensor.dim() != dims) {
    throw std::invalid_argument(fmt::format(
        "clip '{}' has no {}-dimensional '{}': a clip holds vae_latent [C, F, H, W] and text_embedding [L, D]",
        file.string(), dims, name));
  }
  return found->tensor.to(at::kFloat);
}

// Text states [L, D] padded with zeros, or cut, to `text_len` tokens.
inline at::Tensor padded_text(const at::Tensor& text, std::int64_t text_len) {
  const std::int64_t kept = std::min(text.size(0), text_len);
  at::Tensor padded = at::zeros({text_len, text.size(1)}, at::kFloat);
  padded.narrow(0, 0, kept).copy_(text.narrow(0, 0, kept));
  return padded;
}

}  // namespace detail

// One clip: its latents and its text states padded or cut to `text_len` tokens; a file without
// FastVideo's two tensors, or with other shapes, is refused naming it.
inline batch load_clip(const std::filesystem::path& file, std::int64_t text_len) {
  const loom::safetensors_content content = loom::load_safetensors(file);
  return {detail::clip_tensor(content, file, "vae_latent", 4),
          detail::padded_text(detail::clip_tensor(content, file, "text_embedding", 2), text_len)};
}

// A file's text states alone (text_embedding [L, D], a negative prompt's), padded or cut as a clip's.
inline at::Tensor load_text(const std::filesystem::path& file, std::int64_t text_len) {
  return detail::padded_text(detail::clip_tensor(loom::load_safetensors(file), file, "text_embedding", 2), text_len);
}

// Clips as batches: each rank's share of an epoch, in an order drawn from (seed, epoch).
class sampler {
 public:
  sampler(std::vector<std::filesystem::path> files, std::uint64_t seed, int rank, int world_size, std::int64_t batch,
          std::int64_t text_len, const std::string& described)
      : files_(std::move(files)),
        seed_(seed),
        rank_(rank),
        world_size_(world_size),
        batch_(batch),
        text_len_(text_len) {
    share_ = (files_.size() + static_cast<std::size_t>(world_size_) - 1) / static_cast<std::size_t>(world_size_);
    if (share_ < static_cast<std::size_t>(batch_)) {
      throw std::invalid_argument(
          fmt::format("{} ({} clips) has fewer than a batch of {} for each of {} ranks: give "
                      "more clips or a smaller --batch-size",
                      described, files_.size(), batch_, world_size_));
    }
    steps_per_epoch_ = static_cast<std::int64_t>(share_) / batch_;
  }

  // The batch of `index` (from 0): micro-batches in order, across epochs.
  [[nodiscard]] batch at(std::int64_t index) const {
    const auto epoch = static_cast<std::uint64_t>(index / steps_per_epoch_);
    torch::data::samplers::DistributedRandomSampler order(files_.size(), static_cast<std::size_t>(world_size_),
                                                          static_cast<std::size_t>(rank_), /*allow_duplicates=*/true);
    order.set_epoch(seed_ * 1'000'003 + epoch);
    order.reset();
    const std::vector<std::size_t> share = *order.next(share_);
    const auto first = static_cast<std::size_t>((index % steps_per_epoch_) * batch_);
    std::vector<std::size_t> chosen(share.begin() + static_cast<std::ptrdiff_t>(first),
                                    share.begin() + static_cast<std::ptrdiff_t>(first) + batch_);
    return stacked(chosen);
  }

  // The clips a rank evaluates: ⌈clips / ranks⌉ of them, from its rank on, in turn (a clip twice where
  // the ranks outnumber the clips), so every rank has a share; with their indices, for their draws.
  [[nodiscard]] std::pair<batch, std::vector<std::size_t>> held_out_share() const {
    std::vector<std::size_t> chosen;
    for (std::size_t i = static_cast<std::size_t>(rank_); chosen.size() < share_;
         i += static_cast<std::size_t>(world_size_)) {
      chosen.push_back(i % files_.size());
    }
    return {stacked(chosen), chosen};
  }

 private:
  batch stacked(const std::vector<std::size_t>& chosen) const {
    std::vector<at::Tensor> latents, text;
    for (const std::size_t i : chosen) {
      batch clip = load_clip(files_[i], text_len_);
      if (!latents.empty() &&
          (clip.latents.sizes() != latents.front().sizes() || clip.text.size(1) != text.front().size(1))) {
        throw std::invalid_argument(fmt::format(
            "clip '{}' has latents [{}] and text states of width {}, unlike '{}' ([{}]) in the same batch: give clips "
            "of one shape",
            files_[i].string(), fmt::join(clip.latents.sizes(), ", "), clip.text.size(1),
            files_[chosen.front()].string(), fmt::join(latents.front().sizes(), ", ")));
      }
      latents.push_back(clip.latents);
      text.push_back(clip.text);
    }
    return {at::stack(latents), at::stack(text)};
  }

  std::vector<std::filesystem::path> files_;
  std::uint64_t seed_;
  int rank_;
  int world_size_;
  std::int64_t batch_;
  std::int64_t text_len_;
  std::size_t share_ = 0;  // clips for each rank in an epoch
  std::int64_t steps_per_epoch_ = 1;
};

}  // namespace latent_clips
