#pragma once
// A recipe's micro-batches of text: `batch` sequences of loom::data::text_dataset's packed tokens,
// read ahead on a thread of their own, as a [batch, seq_len] tensor of ids (a causal LM's loss
// shifts them into its labels). Its position is loom::train's data_state: a resumed run reads the
// batches an uninterrupted one reads.

#include <loom/data/read_ahead.hpp>
#include <loom/data/text_dataset.hpp>

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace recipes {

class text_batches {
 public:
  text_batches(const loom::data::tokenizer& tokenizer, loom::data::text_dataset_options options, std::int64_t batch)
      : seq_len_(options.seq_len), batch_(batch), reader_(loom::data::text_dataset(tokenizer, std::move(options))) {}

  [[nodiscard]] at::Tensor next() {
    at::Tensor ids = at::empty({batch_, seq_len_}, at::kLong);
    auto rows = ids.accessor<std::int64_t, 2>();
    for (std::int64_t row = 0; row < batch_; ++row) {
      const std::vector<std::int32_t> sequence = reader_.next();
      for (std::int64_t i = 0; i < seq_len_; ++i) rows[row][i] = sequence[static_cast<std::size_t>(i)];
    }
    return ids;
  }

  [[nodiscard]] std::string state() const { return reader_.state(); }
  void restore(const std::string& state) { reader_.restore(state); }

 private:
  std::int64_t seq_len_;
  std::int64_t batch_;
  loom::data::read_ahead reader_;
};

}  // namespace recipes
