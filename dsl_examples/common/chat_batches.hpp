#pragma once
// A recipe's micro-batches of chat data: `batch` of loom::data::chat_dataset's sequences, read ahead on
// a thread of their own, as int64 [batch, tokens] ids, labels (-100 where no loss is taken) and
// positions. Packed, each row holds several examples, each from position 0 and attending within
// itself: CausalLM's forward(ids, labels, positions). Unpacked, each row is one example and the
// micro-batch is cut to its longest (rounded up to a multiple of `multiple`, a sequence group's
// size), as transformers' DataCollatorWithPadding pads: the plain causal loss, padding last, needs
// no mask. Its position is loom::train's data_state: a resumed run reads the batches an
// uninterrupted one reads.

#include <loom/data/chat_dataset.hpp>
#include <loom/data/read_ahead.hpp>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
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
  // With `summarize`, counts an epoch of this rank's records first (chat_dataset::summary(), an
  // epoch's rendering and tokenizing), before the reading thread owns the dataset.
  chat_batches(loom::data::chat_dataset dataset, std::int64_t batch, bool packed, std::int64_t multiple, bool summarize)
      : records_(dataset.records()),
        summary_(summarize ? std::optional(dataset.summary()) : std::nullopt),
        reader_(std::move(dataset)),
        batch_(batch),
        packed_(packed),
        multiple_(multiple) {}

  [[nodiscard]] chat_batch next() {
    std::vector<loom::data::packed_sequence> rows;
    rows.reserve(static_cast<std::size_t>(batch_));
    std::int64_t longest = 0;
    for (std::int64_t row = 0; row < batch_; ++row) {
      rows.push_back(reader_.next());
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

  [[nodiscard]] std::string state() const { return reader_.state(); }
  void restore(const std::string& state) { reader_.restore(state); }
  [[nodiscard]] const std::string& identity() const noexcept { return reader_.identity(); }

  [[nodiscard]] bool packed() const noexcept { return packed_; }
  [[nodiscard]] std::int64_t records() const noexcept { return records_; }  // every rank's
  // This rank's first epoch, counted (with `summarize`).
  [[nodiscard]] const std::optional<loom::data::chat_data_summary>& summary() const noexcept { return summary_; }

  // How far this rank has read, from the position after the last batch: whole epochs and the share of
  // the current one's sequences (from the summary; none without it), and the malformed records skipped.
  struct progress {
    double epochs = 0;
    std::int64_t skipped_records = 0;
  };
  [[nodiscard]] progress read_so_far() const {
    const nlohmann::json position = nlohmann::json::parse(reader_.state());
    const double in_epoch = summary_ && summary_->sequences > 0 ? position.at("sequences_in_epoch").get<double>() /
                                                                      static_cast<double>(summary_->sequences)
                                                                : 0.0;
    return {.epochs = position.at("epoch").get<double>() + in_epoch,
            .skipped_records = position.at("skipped_records").get<std::int64_t>()};
  }

 private:
  std::int64_t records_;
  std::optional<loom::data::chat_data_summary> summary_;
  loom::data::basic_read_ahead<loom::data::chat_dataset> reader_;
  std::int64_t batch_;
  bool packed_;
  std::int64_t multiple_;
};

}  // namespace recipes
