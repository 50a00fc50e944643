#pragma once
// LoRA adapters injected into a built module (docs/dsl.md): which layers a lora(...) stage adapts,
// on two paths that share one adapter (loom/lora/adapter.hpp): loom::nn::Linear's unmerged fast
// path and torch::nn::Linear's effective-weight fallback; freezing, merge and unmerge.

#include <loom/dsl/lora.hpp>
#include <loom/dsl/targets.hpp>
#include <loom/lora/adapter.hpp>
#include <loom/lora/scaling.hpp>
#include <loom/nn/linear.hpp>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

// The dotted `name` is selected by `target`: equal to it, ending with "." + it, or (a pattern) a
// whole match of its regular expression.
[[nodiscard]] bool matches(const target& target, std::string_view name);
[[nodiscard]] bool matches_any(const target_list& targets, std::string_view name);

// What a model says of its names for lora(...)'s targets: other names its users give its modules
// (loom::target_alias), and its output head, which loom::all_linear leaves out (none: every linear
// layer).
struct lora_model_names {
  std::span<const target_alias> aliases{};
  std::string_view output_embeddings{};
};

// A parameter a model does not hold because it reads another: a tied head's "lm_head.weight" reads
// "model.embed_tokens.weight" (transformers' _tied_weights_keys, when tie_word_embeddings holds).
struct tied_parameter {
  std::string name;
  std::string reads;
};

class lora_layers {
 public:
  lora_layers() = default;

  // Adapts every linear layer under `root` that a target of `spec` selects and no exclusion does,
  // each of the rank and scale PEFT's rules give it (loom/lora/scaling.hpp), drawing A from the
  // current default generator (the forked one under seeded). Throws std::invalid_argument when
  // nothing matches or a target selects a module that is not linear. `model_name` names the model in
  // errors. `compute_dtype`: what the updates compute in (mixed_precision's param), none for each
  // adapter's own (lora_adapter_options). A name target (or exclusion) that is, or ends with, one of
  // the model's aliases selects what the alias stands for: `to_out` is `to_out.0` on a model that
  // declares {"to_out", "to_out.0"}.
  static lora_layers inject(torch::nn::Module& root, std::string_view model_name, const lora_stage& spec,
                            std::optional<at::ScalarType> compute_dtype = std::nullopt, lora_model_names names = {});

  [[nodiscard]] std::size_t fast_path_count() const noexcept { return fast_.size(); }
  [[nodiscard]] std::size_t fallback_count() const noexcept { return fallback_.size(); }
  [[nodiscard]] const std::vector<std::string>& adapted() const noexcept { return adapted_; }
  [[nodiscard]] bool empty() const noexcept { return adapted_.empty(); }
  // The plan's lora(rank, ..., {.alpha, .dropout, .use_rslora, .rank_pattern, .alpha_pattern}).
  [[nodiscard]] std::int64_t rank() const noexcept { return rules_.r; }
  [[nodiscard]] double alpha() const noexcept { return rules_.lora_alpha; }
  [[nodiscard]] double dropout() const noexcept { return dropout_; }
  [[nodiscard]] const lora_scaling_rules& rules() const noexcept { return rules_; }
  // The modules trained whole and saved beside the adapters (PEFT's modules_to_save).
  [[nodiscard]] const target_list& modules_to_save() const noexcept { return modules_to_save_; }
  // Whether the dotted parameter `name` is in a module that modules_to_save selects.
  [[nodiscard]] bool saves(std::string_view parameter) const;
  // Sets the parameters of modules_to_save's modules trainable. Throws std::invalid_argument for a
  // name that selects no module, saying, for one that names a tied parameter (`tied`), what to save.
  void train_modules_to_save(torch::nn::Module& root, std::string_view model_name,
                             std::span<const tied_parameter> tied) const;
  // Whether merge() folded the adapters into the base weights (and unmerge() has not taken them out).
  [[nodiscard]] bool merged() const noexcept { return merged_; }

  // The fallback path: each adapted torch::nn::Linear computes with W + scaling · B·A for the
  // duration of one forward; the guard puts W back.
  class forward_guard {
   public:
    explicit forward_guard(lora_layers& layers);
    ~forward_guard();
    forward_guard(const forward_guard&) = delete;
    forward_guard& operator=(const forward_guard&) = delete;

   private:
    lora_layers& layers_;
  };

  void merge();
  void unmerge();

 private:
  struct fallback_layer {
    std::shared_ptr<torch::nn::LinearImpl> layer;
    at::Tensor base_weight;  // the registered parameter; layer->weight points elsewhere in forward
    lora_adapter adapter;
  };

  lora_scaling_rules rules_;
  double dropout_ = 0;
  target_list modules_to_save_;
  std::vector<std::string> adapted_;
  std::vector<std::shared_ptr<nn::LinearImpl>> fast_;
  std::vector<fallback_layer> fallback_;
  bool merged_ = false;
};

// requires_grad: with LoRA, only the adapters; plus every parameter under a module (or with a name)
// that `patterns` selects. Throws std::invalid_argument for a pattern that selects nothing.
void set_trainable(torch::nn::Module& root, std::string_view model_name, bool has_lora, const target_list& patterns);

}  // namespace loom
