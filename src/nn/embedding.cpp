#include <loom/nn/embedding.hpp>

#include <loom/nn/at_rest.hpp>

#include <loom/base/text.hpp>
#include <loom/nn/deferred_init.hpp>

#include <ATen/ATen.h>
#include <torch/nn/functional/embedding.h>
#include <torch/nn/init.h>

#include <stdexcept>

namespace loom::nn {

EmbeddingImpl::EmbeddingImpl(const torch::nn::EmbeddingOptions& options_) : options(options_) {
  if (options._weight().defined()) {
    throw_error<std::invalid_argument>(
        "loom::nn::Embedding takes no _weight: construct it by its sizes and load the table with pretrained(path) "
        "or job.load_weights");
  }
  reset();
}

void EmbeddingImpl::reset() {
  // torch::nn::EmbeddingImpl's checks, registration and draws, so that a seed gives either the same table.
  if (const auto padding = options.padding_idx()) {
    const std::int64_t rows = options.num_embeddings();
    if (*padding >= rows || *padding < -rows) {
      throw_error<std::invalid_argument>("loom::nn::Embedding: padding_idx {} is outside its {} rows", *padding, rows);
    }
    if (*padding < 0) options.padding_idx(rows + *padding);
  }
  weight = register_parameter("weight", nn::empty({options.num_embeddings(), options.embedding_dim()}));
  reset_parameters();
}

void EmbeddingImpl::reset_parameters() {
  nn::initialise(weight, {[padding = options.padding_idx()](at::Tensor& table) {
                   torch::nn::init::normal_(table);
                   if (padding) table[*padding].fill_(0);
                 }});
}

void EmbeddingImpl::pretty_print(std::ostream& stream) const {
  stream << "loom::nn::Embedding(num_embeddings=" << options.num_embeddings()
         << ", embedding_dim=" << options.embedding_dim();
  if (options.padding_idx()) stream << ", padding_idx=" << *options.padding_idx();
  stream << ")";
}

at::Tensor EmbeddingImpl::forward(const at::Tensor& indices) {
  namespace F = torch::nn::functional;
  require_bytes(weight, "loom::nn::Embedding");
  return F::detail::embedding(indices, weight, options.padding_idx(), options.max_norm(), options.norm_type(),
                              options.scale_grad_by_freq(), options.sparse());
}

}  // namespace loom::nn
