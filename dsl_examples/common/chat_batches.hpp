#pragma once
// A recipe's micro-batches of chat data: `batch` of loom::data::chat_dataset's sequences as int64
// [batch, tokens] ids, labels (-100 where no loss is taken) and positions. Packed, each row holds
// several examples, each from position 0 and attending within itself: CausalLM's
// forward(ids, labels, positions). Unpacked, each row is one example and the micro-batch is cut to
// its longest (rounded up to a multiple of `multiple`, a sequence group's size), as transformers'
// DataCollatorWithPadding pads: the plain causal loss, padding last, needs no mask. Its position is
// the dataset's, read on the training thread: loom::train's data_state.

#include <loom/data/chat_dataset.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace recipes {

struct chat_batch {
  at::Tensor ids, labels;
  at::Tensor positions;  // undefined when unpacked
};

class chat_batches {
 public:
  chat_batches(loom::data::chat_dataset dataset, std::int64_t batch, bool packed, std::int64_t multiple)
      : dataset_(std::move(dataset)), batch_(batch), packed_(packed), multiple_(multiple) {}

  [[nodiscard]] chat_batch next() {
    std::vector<loom::data::packed_sequence> rows;
    rows.reserve(static_cast<std::size_t>(batch_));
    std::int64_t longest = 0;
    for (std::int64_t row = 0; row < batch_; ++row) {
      rows.push_back(dataset_.next());
      longest = std::max(longest, rows.back().tokens);
    }
    const auto seq_len = static_cast<std::int64_t>(rows.front().ids.size());
    const std::int64_t width = packed_ ? seq_len : std::min(seq_len, (longest + multiple_ - 1) / multiple_ * multiple_);
    const auto tensor_of = [&](std::vector<std::int32_t> loom::data::packed_sequence::*field) {
      at::Tensor out = at::empty({batch_, width}, at::kLong);
      auto cells = out.accessor<std::int64_t, 2>();
      for (std::int64_t row = 0; row < batch_; ++row) {
        const std::vector<std::int32_t>& values = rows[static_cast<std::size_t>(row)].*field;
        for (std::int64_t i = 0; i < width; ++i) cells[row][i] = values[static_cast<std::size_t>(i)];
      }
      return out;
    };
    return {.ids = tensor_of(&loom::data::packed_sequence::ids),
            .labels = tensor_of(&loom::data::packed_sequence::labels),
            .positions = packed_ ? tensor_of(&loom::data::packed_sequence::positions) : at::Tensor()};
  }

  [[nodiscard]] std::string state() const { return dataset_.state(); }
  void restore(const std::string& state) { dataset_.restore(state); }
  [[nodiscard]] const std::string& identity() const noexcept { return dataset_.identity(); }
  [[nodiscard]] const loom::data::chat_dataset& dataset() const noexcept { return dataset_; }
  [[nodiscard]] bool packed() const noexcept { return packed_; }

 private:
  loom::data::chat_dataset dataset_;
  std::int64_t batch_;
  bool packed_;
  std::int64_t multiple_;
};

}  // namespace recipes
