#pragma once
// loom::nn::Embedding: a drop-in for torch::nn::Embedding (same options, parameter name, draws and
// lookups) whose table a sharding strategy can construct without its bytes (loom/nn/deferred_init.hpp).

#include <loom/nn/tensor_parallel.hpp>

#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/options/embedding.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <ostream>

namespace loom::nn {

class EmbeddingImpl : public torch::nn::Cloneable<EmbeddingImpl>, public parallel_module {
 public:
  EmbeddingImpl(std::int64_t num_embeddings, std::int64_t embedding_dim)
      : EmbeddingImpl(torch::nn::EmbeddingOptions(num_embeddings, embedding_dim)) {}
  // A table given through options._weight is refused: load it with pretrained(...) or load_weights.
  explicit EmbeddingImpl(const torch::nn::EmbeddingOptions& options);

  void reset() override;
  // N(0, 1), the padding row zero.
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  at::Tensor forward(const at::Tensor& indices);

  // Keeps this rank's rows of the table under tensor_parallel (loom/nn/tensor_parallel.hpp), style
  // vocab: each rank looks up the ids in its rows, zeros elsewhere, and the lookups are summed over
  // the group.
  [[nodiscard]] std::optional<cut> cut_by(parallel_style style) const override;
  std::vector<split_parameter> split(parallel_style style, std::shared_ptr<tensor_split> split) override;
  // In forward, the lookups summed over the group.
  [[nodiscard]] std::vector<exchange> exchanges() const override;
  void declared_at(std::size_t first) override { exchange_ = first; }
  // The first id of this rank's rows: 0 unless split.
  [[nodiscard]] std::int64_t first_row() const noexcept { return first_row_; }
  [[nodiscard]] const std::shared_ptr<tensor_split>& split() const noexcept { return split_; }

  torch::nn::EmbeddingOptions options;
  at::Tensor weight;

 private:
  std::shared_ptr<tensor_split> split_;
  std::int64_t first_row_ = 0;
  std::size_t exchange_ = 0;  // its lookups' place among the split's exchanges
};

TORCH_MODULE(Embedding);

}  // namespace loom::nn
