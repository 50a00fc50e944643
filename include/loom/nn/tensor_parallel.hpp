#pragma once
// Where a model meets tensor_parallel(k) (docs/tensor_parallel.md): Megatron's split layers over a
// group of k consecutive ranks, each rank computing its slice of every parallel layer.
//
// A model marks its parallel layers once, by name, as transformers' tp_plan and torchtitan's
// parallelize_module do: a static member
//
//   static std::vector<loom::nn::parallel_layer> tensor_parallel_plan();
//
// that build() applies when the plan has tensor_parallel(k), k > 1:
// - colwise: a loom::nn::Linear keeps 1/k of its output features (its weight's rows and bias); its
//   input enters whole, and its gradient is summed over the group (Megatron's f). Attention's q, k, v
//   split by heads, an MLP's gate and up, a head by vocabulary.
// - rowwise: a loom::nn::Linear keeps 1/k of its input features (its weight's columns); the partial
//   outputs are summed over the group (Megatron's g), the bias added once. Attention's o, an MLP's down.
// - vocab: a loom::nn::Embedding keeps 1/k of its rows; each rank looks up the ids in its rows, and
//   the lookups are summed over the group.
// - gradient_summed: weights every rank holds whole but uses on its slice alone (a norm over each of
//   its heads): their gradient is summed over the group.
// A LoRA adapter follows its layer: over a colwise base B is split like the output and A whole, over
// a rowwise one A is split like the input and B whole (PEFT's placements over DTensor); the rank-r
// activation between them is exchanged as the base's is. Every loom::nn::Attention keeps heads / k.

#include <loom/nn/sequence_parallel.hpp>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom {
class tensor_group;
}

namespace loom::nn {

enum class parallel_style : std::uint8_t { colwise, rowwise, vocab, gradient_summed };
[[nodiscard]] std::string_view name_of(parallel_style style) noexcept;

// A model's mark of its parallel layers: `pattern` is a module's dotted name, each `*` standing for
// one part of it ("model.layers.*.self_attn.q_proj").
struct parallel_layer {
  std::string pattern;
  parallel_style style;
};

// The plan's tensor group as the split layers use it, made by build() for tensor_parallel(k), k > 1.
class tensor_split {
 public:
  explicit tensor_split(std::shared_ptr<tensor_group> group);
  ~tensor_split();
  tensor_split(const tensor_split&) = delete;
  tensor_split& operator=(const tensor_split&) = delete;

  [[nodiscard]] const tensor_group& group() const noexcept { return *group_; }
  [[nodiscard]] int size() const noexcept;
  [[nodiscard]] int rank() const noexcept;

  // This rank's slice [begin, begin + size / k) of a dimension of `size`.
  [[nodiscard]] std::int64_t slice_begin(std::int64_t size) const noexcept { return size / this->size() * rank(); }
  // A copy of this rank's slice of `whole` along `dim`.
  [[nodiscard]] at::Tensor slice(const at::Tensor& whole, std::int64_t dim) const;

  // Megatron's f: the identity, whose backward sums the gradient over the group (where a whole
  // activation enters split layers).
  [[nodiscard]] at::Tensor enter(const at::Tensor& whole);
  // Megatron's g: the partial results of split layers summed over the group; backward the identity.
  [[nodiscard]] at::Tensor reduce(const at::Tensor& partial);
  // Each rank's part along `dim` joined, on every rank; backward keeps this rank's part.
  [[nodiscard]] at::Tensor gather(const at::Tensor& part, std::int64_t dim);

  // The summed cross-entropy of [tokens, vocab / k] logits (this rank's slice of the vocabulary)
  // against whole-vocabulary targets (-100 left out), without gathering the logits: the row maxima,
  // the sums of exponentials and the targets' logits are exchanged instead. Differentiable in logits.
  [[nodiscard]] at::Tensor summed_cross_entropy(const at::Tensor& logits, const at::Tensor& targets);

  // Sums the gradient of `parameter` over the group as autograd computes it (gradient_summed).
  void sum_gradient_of(at::Tensor& parameter);

 private:
  std::shared_ptr<tensor_group> group_;
};

// Splits `model`'s layers by `plan` over `split`'s group, and its attentions' heads; names
// `model_name` and the layer in every refusal (a pattern that matches nothing, a layer of another
// type, a dimension or a head count k does not divide).
void split_layers(torch::nn::Module& model, std::string_view model_name, const std::vector<parallel_layer>& plan,
                  const std::shared_ptr<tensor_split>& split);

}  // namespace loom::nn
