#pragma once
// Text as tokens for the example recipes (tiny-gpt, finetune): bytes & 127 (the licence texts are
// ASCII, so nothing is lost), and batches of windows whose order is a function of (seed, step), so a
// resumed run draws the batches it would have drawn.

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

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

// `batch` windows of `context` tokens at random offsets, and the same windows shifted by one as
// targets; the batch of a step is a function of (seed, step).
class batch_sampler {
 public:
  batch_sampler(at::Tensor tokens, std::uint64_t seed, std::int64_t batch, std::int64_t context)
      : tokens_(std::move(tokens)), seed_(seed), batch_(batch), context_(context) {
    if (tokens_.numel() <= context_) throw std::runtime_error("the text is shorter than one context window");
  }

  [[nodiscard]] std::pair<at::Tensor, at::Tensor> at_step(std::int64_t step) const {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(seed_ * 1'000'003 + static_cast<std::uint64_t>(step));
    auto starts = torch::randint(tokens_.numel() - context_, {batch_, 1}, generator, torch::kLong);
    auto positions = starts + torch::arange(context_, torch::kLong);
    return {tokens_.index({positions}), tokens_.index({positions + 1})};
  }

 private:
  at::Tensor tokens_;
  std::uint64_t seed_;
  std::int64_t batch_;
  std::int64_t context_;
};

}  // namespace text_data
