#pragma once
// A recipe's micro-batches of text: `batch` sequences of loom::data::text_dataset's packed tokens,
// read ahead on a thread of their own, as a [batch, seq_len] tensor of ids (a causal LM's loss
// shifts them into its labels). Its position is loom::train's data_state: a resumed run reads the
// batches an uninterrupted one reads.

#include <loom/data/read_ahead.hpp>
#include <loom/data/text_dataset.hpp>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace recipes {

class text_batches {
 public:
  text_batches(const loom::data::tokenizer& tokenizer, loom::data::text_dataset_options options, std::int64_t batch)
      : text_batches(loom::data::text_dataset(tokenizer, options), options.seq_len, batch) {}

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
  // The files' names, sizes and digest: what loom::train's data_identity compares on resume.
  [[nodiscard]] const std::string& identity() const noexcept { return reader_.identity(); }
  void restore(const std::string& state) { reader_.restore(state); }

  // The documents of all the files (every rank's), counted as the dataset indexed them.
  [[nodiscard]] std::int64_t documents() const noexcept { return documents_; }
  // How far this rank has read: whole epochs and the fraction of its documents read in the current
  // one, and the malformed lines it skipped (from the position after the last batch read).
  struct progress {
    double epochs = 0;
    std::int64_t skipped_lines = 0;
  };
  [[nodiscard]] progress read_so_far(int data_world_size) const {
    const nlohmann::json position = nlohmann::json::parse(reader_.state());
    const double rank_documents = static_cast<double>(documents_) / static_cast<double>(data_world_size);
    return {.epochs = position.at("epoch").get<double>() +
                      position.at("documents_read").get<double>() / std::max(rank_documents, 1.0),
            .skipped_lines = position.at("skipped_lines").get<std::int64_t>()};
  }

 private:
  text_batches(loom::data::text_dataset dataset, std::int64_t seq_len, std::int64_t batch)
      : seq_len_(seq_len), batch_(batch), documents_(dataset.documents()), reader_(std::move(dataset)) {}

  std::int64_t seq_len_;
  std::int64_t batch_;
  std::int64_t documents_;
  loom::data::read_ahead reader_;
};

}  // namespace recipes
