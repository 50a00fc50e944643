#include <loom/nn/embedding.hpp>

#include <loom/nn/at_rest.hpp>

#include <loom/base/text.hpp>
#include <loom/nn/deferred_init.hpp>
#include <loom/nn/tensor_parallel.hpp>

#include <ATen/ATen.h>
#include <torch/nn/functional/embedding.h>
#include <torch/nn/init.h>

#include <optional>
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
  if (!split_) {
    return F::detail::embedding(indices, weight, options.padding_idx(), options.max_norm(), options.norm_type(),
                                options.scale_grad_by_freq(), options.sparse());
  }
  const at::Tensor mine = indices.ge(first_row_).logical_and(indices.lt(first_row_ + weight.size(0)));
  const at::Tensor rows = at::where(mine, indices - first_row_, 0);
  // The padding row, where this rank holds it, as torch::nn::Embedding keeps it: no gradient.
  std::optional<std::int64_t> padding;
  if (options.padding_idx() && *options.padding_idx() >= first_row_ &&
      *options.padding_idx() < first_row_ + weight.size(0)) {
    padding = *options.padding_idx() - first_row_;
  }
  const at::Tensor looked_up = F::detail::embedding(rows, weight, padding, options.max_norm(), options.norm_type(),
                                                    options.scale_grad_by_freq(), options.sparse());
  return split_->reduce(looked_up * mine.unsqueeze(-1).to(looked_up.scalar_type()), exchange_);
}

std::optional<parallel_module::cut> EmbeddingImpl::cut_by(parallel_style style) const {
  if (style == parallel_style::vocab) return cut{options.num_embeddings(), "rows (its vocabulary)"};
  return std::nullopt;
}

std::vector<split_parameter> EmbeddingImpl::split(parallel_style style, std::shared_ptr<tensor_split> split) {
  if (split_) throw std::logic_error("loom::nn::Embedding is split already");
  if (!cut_by(style)) throw std::logic_error("loom::nn::Embedding splits by vocab");
  if (options.max_norm() || options.scale_grad_by_freq()) {
    throw_error<std::invalid_argument>(
        "loom::nn::Embedding with {}: tensor_parallel splits a table without one (each rank would renormalise "
        "or count its rows alone); give the model's table none",
        options.max_norm() ? "a max_norm" : "scale_grad_by_freq");
  }
  torch::NoGradGuard no_grad;
  first_row_ = split->slice_begin(weight.size(0));
  at::Tensor(weight).set_data(split->slice(weight, 0));
  split_ = std::move(split);
  return {{"weight", 0}};
}

std::vector<parallel_module::exchange> EmbeddingImpl::exchanges() const {
  if (!split_) return {};
  return {{"lookups", collective_op::all_reduce, step_phase::forward, options.embedding_dim()}};
}

}  // namespace loom::nn
