#pragma once
// Text as tokens for the example recipes (tiny-gpt, finetune): bytes & 127 (the licence texts are
// ASCII, so nothing is lost), and each rank's batches of windows, in an order that is a function of
// (seed, rank, epoch, step), so a resumed run draws the batches it would have drawn.

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace text_data {

inline std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + file.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline at::Tensor encode(std::string_view text) {
  auto tokens = torch::empty({static_cast<std::int64_t>(text.size())}, torch::kLong);
  auto* out = tokens.data_ptr<std::int64_t>();
  for (const char c : text) *out++ = static_cast<unsigned char>(c) & 127;
  return tokens;
}

// Newlines become spaces: a sample prints as one line.
inline std::string decode(const at::Tensor& tokens) {
  const auto flat = tokens.contiguous();
  const auto* data = flat.data_ptr<std::int64_t>();
  std::string text;
  for (std::int64_t i = 0; i < tokens.numel(); ++i) text += data[i] == '\n' ? ' ' : static_cast<char>(data[i]);
  return text;
}

inline at::Tensor load_tokens(const std::vector<std::filesystem::path>& files) {
  std::string text;
  for (const auto& file : files) text += read_text(file) + '\n';
  return encode(text);
}

// Each rank's batches of `batch` windows of `context` tokens, and the same windows shifted by one as
// targets. An epoch cuts the text into windows from an offset drawn from (seed, epoch), and LibTorch's
// DistributedRandomSampler gives each rank its own share of them, shuffled by (seed, epoch); an
// epoch is one pass over a rank's share. The batch of a step is a function of (seed, rank, epoch,
// step), so nothing needs saving to resume. Too short a text for a batch on every rank is refused,
// naming it as `described` ("the held-out tenth of --tokens 'gpl3.bin'") with `remedy` (the
// recipe's knobs: "give a longer token file, a shorter --seq-len or a smaller --batch-size").
class batch_sampler {
 public:
  batch_sampler(at::Tensor tokens, std::uint64_t seed, int rank, int world_size, std::int64_t batch,
                std::int64_t context, std::string_view described = "the text",
                std::string_view remedy = "give a longer text or fewer ranks")
      : tokens_(std::move(tokens)),
        seed_(seed),
        rank_(rank),
        world_size_(world_size),
        batch_(batch),
        context_(context),
        windows_(static_cast<std::size_t>(std::max<std::int64_t>(0, (tokens_.numel() - context_ - 1) / context_))) {
    share_ = (windows_ + static_cast<std::size_t>(world_size_) - 1) / static_cast<std::size_t>(world_size_);
    if (share_ < static_cast<std::size_t>(batch_)) {
      throw std::runtime_error(std::string(described) + " (" + std::to_string(tokens_.numel()) + " tokens) has " +
                               std::to_string(windows_) + " windows of " + std::to_string(context_) +
                               " tokens, fewer than a batch of " + std::to_string(batch_) + " for each of " +
                               std::to_string(world_size_) + " ranks: " + std::string(remedy));
    }
    steps_per_epoch_ = static_cast<std::int64_t>(share_) / batch_;
  }

  [[nodiscard]] std::int64_t tokens() const noexcept { return tokens_.numel(); }
  // Passes over this rank's share of the windows that `batches` batches make.
  [[nodiscard]] double epochs_of(std::int64_t batches) const noexcept {
    return static_cast<double>(batches) / static_cast<double>(steps_per_epoch_);
  }

  // The batch of `step` (from 0).
  [[nodiscard]] std::pair<at::Tensor, at::Tensor> at_step(std::int64_t step) const {
    const auto epoch = static_cast<std::uint64_t>(step / steps_per_epoch_);
    const std::uint64_t epoch_seed = seed_ * 1'000'003 + epoch;
    torch::data::samplers::DistributedRandomSampler sampler(windows_, static_cast<std::size_t>(world_size_),
                                                            static_cast<std::size_t>(rank_),
                                                            /*allow_duplicates=*/true);
    sampler.set_epoch(epoch_seed);
    sampler.reset();
    const std::vector<std::size_t> share = *sampler.next(share_);  // allow_duplicates: every rank's share is this long
    const auto first = static_cast<std::size_t>((step % steps_per_epoch_) * batch_);
    const auto offset = static_cast<std::int64_t>(epoch_seed % static_cast<std::uint64_t>(context_));
    auto starts = torch::empty({batch_, 1}, torch::kLong);
    for (std::int64_t i = 0; i < batch_; ++i) {
      starts[i][0] = offset + static_cast<std::int64_t>(share[first + static_cast<std::size_t>(i)]) * context_;
    }
    auto positions = starts + torch::arange(context_, torch::kLong);
    return {tokens_.index({positions}), tokens_.index({positions + 1})};
  }

 private:
  at::Tensor tokens_;
  std::uint64_t seed_;
  int rank_;
  int world_size_;
  std::int64_t batch_;
  std::int64_t context_;
  std::size_t windows_;
  std::size_t share_ = 0;  // windows for each rank in an epoch
  std::int64_t steps_per_epoch_ = 1;
};

}  // namespace text_data
