#pragma once
// One LoRA adapter of a linear layer, and the math that both of loom's paths share: the
// loom::nn::Linear fast path adds scaling · B(A(dropout(x))) to the base output, the
// torch::nn::Linear fallback computes with the effective weight W + scaling · B·A, and merge folds
// the same scaling · B·A into W.

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string_view>

namespace torch::nn {
class Module;
}

namespace loom {

struct lora_adapter_options {
  std::int64_t rank;
  double scaling;  // alpha / rank
  double dropout;  // on the adapter branch's input only
  // What the update is computed in: mixed_precision's param, so that the adapters compute as the
  // base does; none: the adapter's own dtype, the input cast to it (PEFT's), the result cast back.
  std::optional<at::ScalarType> compute_dtype{};
};

struct lora_adapter : lora_adapter_options {
  // The parameters' names on the adapted layer (PEFT's names).
  static constexpr std::string_view a_name = "lora_A";
  static constexpr std::string_view b_name = "lora_B";

  // Registers lora_A (rank × in, kaiming-uniform with a = √5, drawn from the current default
  // generator) and lora_B (out × rank, zeros) on `layer`, so its output is unchanged until B moves.
  static lora_adapter attach(torch::nn::Module& layer, std::int64_t in_features, std::int64_t out_features,
                             const lora_adapter_options& options);

  // Whether a dotted parameter name is an adapter's.
  [[nodiscard]] static bool is_adapter_parameter(std::string_view name) noexcept;

  // The fast path: `output` (the base layer's, for `input`) plus scaling · B(A(dropout(input))).
  [[nodiscard]] at::Tensor add_update(at::Tensor output, const at::Tensor& input, bool training) const;
  // Its two halves, for a layer split across ranks, which exchanges the rank-r activation between
  // them: A(dropout(input)) in the compute dtype, and `output` plus scaling · B(down).
  [[nodiscard]] at::Tensor down(const at::Tensor& input, bool training) const;
  [[nodiscard]] at::Tensor add_up(at::Tensor output, const at::Tensor& down) const;
  // The fallback path: W + scaling · B·A, differentiable in A and B.
  [[nodiscard]] at::Tensor effective_weight(const at::Tensor& weight) const;
  // W += scaling · B·A, and back, in W's dtype.
  void merge_into(at::Tensor& weight) const;
  void unmerge_from(at::Tensor& weight) const;

  at::Tensor lora_A;
  at::Tensor lora_B;
};

}  // namespace loom
