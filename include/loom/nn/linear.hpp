#pragma once
// loom::nn::Linear: a drop-in for torch::nn::Linear (same options, parameter names and
// initialisation; results as PyTorch's nn.Linear computes them, at::linear) that can carry a LoRA
// adapter on the fast unmerged path
//   y = base(x) + scaling · B(A(dropout(x))).

#include <loom/lora/adapter.hpp>
#include <loom/nn/tensor_parallel.hpp>
#include <loom/quant/quantized_weight.hpp>

#include <torch/nn/cloneable.h>
#include <torch/nn/options/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <optional>

namespace loom::nn {

class LinearImpl : public torch::nn::Cloneable<LinearImpl>, public parallel_module {
 public:
  LinearImpl(std::int64_t in_features, std::int64_t out_features)
      : LinearImpl(torch::nn::LinearOptions(in_features, out_features)) {}
  explicit LinearImpl(const torch::nn::LinearOptions& options);

  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  at::Tensor forward(const at::Tensor& input);

  // Registers lora_A and lora_B (loom/lora/adapter.hpp), so the output is unchanged until B is trained.
  void add_adapter(const lora_adapter_options& options);
  [[nodiscard]] bool has_adapter() const noexcept { return adapter_.has_value(); }
  [[nodiscard]] const std::optional<lora_adapter>& adapter() const noexcept { return adapter_; }

  // The base weight held quantized (loom/quant/quantized_weight.hpp), as `parts` of a weight of this
  // layer's shape: `weight` leaves the layer's parameters, the parts (frozen bytes, or tensors that
  // get them later, as a deferred construction's do) take its place, and forward dequantizes them, in
  // the input's dtype, for each product. Once.
  void hold_quantized(quant::quantized_weight parts);
  [[nodiscard]] const std::optional<quant::quantized_weight>& quantized() const noexcept { return quantized_; }
  // A quantized layer's weight as a saved model holds it, from its parts whole (a state_dict's): the
  // base dequantized in fp32, with the adapter's update added when merged.
  [[nodiscard]] at::Tensor saved_weight(const at::Tensor& codes, const at::Tensor& statistics) const;

  // Keeps this rank's slice of the layer under tensor_parallel (loom/nn/tensor_parallel.hpp): colwise
  // its output features (and B's), rowwise its input features (and A's).
  [[nodiscard]] std::optional<cut> cut_by(parallel_style style) const override;
  std::vector<split_parameter> split(parallel_style style, std::shared_ptr<tensor_split> split) override;
  // Colwise, in backward, the input's gradient (and the adapter's rank-r one); rowwise, in forward,
  // the partial output (and the adapter's partial rank-r activation).
  [[nodiscard]] std::vector<exchange> exchanges() const override;
  void declared_at(std::size_t first) override { first_exchange_ = first; }
  [[nodiscard]] std::optional<parallel_style> parallel() const noexcept { return style_; }

  // Folds scaling · B·A into weight (forward then runs the base alone), and takes it out again; a
  // quantized layer only notes it (saved_weight adds the update).
  void merge();
  void unmerge();
  [[nodiscard]] bool merged() const noexcept { return merged_; }

  torch::nn::LinearOptions options;
  at::Tensor weight;
  at::Tensor bias;
  at::Tensor lora_A;
  at::Tensor lora_B;

 private:
  at::Tensor split_forward(const at::Tensor& input);

  std::optional<lora_adapter> adapter_;
  std::optional<quant::quantized_weight> quantized_;
  std::shared_ptr<tensor_split> split_;
  std::optional<parallel_style> style_;
  std::size_t first_exchange_ = 0;  // its exchanges' place among the split's: the base's, then the adapter's
  bool merged_ = false;
};

TORCH_MODULE(Linear);

}  // namespace loom::nn
