#pragma once
// Where a model meets tensor_parallel(k) (docs/tensor_parallel.md): Megatron's split layers over a
// group of k consecutive ranks, each rank computing its slice of every parallel layer.
//
// A model marks its parallel layers once, by name, as transformers' tp_plan and torchtitan's
// parallelize_module do: a member, which may read the model's configuration,
//
//   std::vector<loom::nn::parallel_layer> tensor_parallel_plan() const;
//
// that build() applies when the plan has tensor_parallel(k), k > 1:
// A module marked with a style takes part as loom::nn::parallel_module; gradient_summed takes any.
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
#include <loom/runtime/tensors.hpp>
#include <loom/schedule/schedule.hpp>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
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

// A parameter a split cut: its dotted name and the dimension each rank keeps 1/k of.
struct split_parameter {
  std::string name;
  std::int64_t dim;
};

class tensor_split;

// A module that takes part in tensor_parallel: loom::nn::Linear and loom::nn::Embedding, and a model's
// own (a norm over the features of a colwise projection, which sums its squares over the group).
class parallel_module {
 public:
  // The dimension `style` cuts: its size and what it is ("output features"), which k must divide;
  // none when the module takes no such style.
  struct cut {
    std::int64_t size;
    std::string_view what;
  };
  [[nodiscard]] virtual std::optional<cut> cut_by(parallel_style style) const = 0;
  // Keeps this rank's part for `style` (one of those cut_by describes), once, before a strategy;
  // returns each parameter it cut, by its name on the module.
  virtual std::vector<split_parameter> split(parallel_style style, std::shared_ptr<tensor_split> split) = 0;
  // What a step sends over the group for the split module, one token's values each: declared in the
  // collective schedule, and so checked across ranks before the first step.
  struct exchange {
    std::string what;  // "input gradient"
    collective_op op;
    step_phase phase;  // forward or backward; a recomputed unit's forward ones again in recompute
    std::int64_t values_per_token;
  };
  [[nodiscard]] virtual std::vector<exchange> exchanges() const { return {}; }
  // Where the split declared them: exchange i of this module is the split's exchange first + i, which
  // the module names when it issues it (tensor_split::enter, reduce), so that it is checked.
  virtual void declared_at(std::size_t /*first*/) {}

 protected:
  parallel_module() = default;
  parallel_module(const parallel_module&) = default;
  parallel_module& operator=(const parallel_module&) = default;
  ~parallel_module() = default;
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
  // activation enters split layers). `exchange`: the declared exchange it is, checked as it is issued.
  [[nodiscard]] at::Tensor enter(const at::Tensor& whole, std::optional<std::size_t> exchange = std::nullopt);
  // Megatron's g: the partial results of split layers summed over the group; backward the identity.
  [[nodiscard]] at::Tensor reduce(const at::Tensor& partial, std::optional<std::size_t> exchange = std::nullopt);
  // Each rank's part along `dim` joined, on every rank; backward keeps this rank's part.
  [[nodiscard]] at::Tensor gather(const at::Tensor& part, std::int64_t dim);
  // `part` summed over the group in forward and in backward: a sum over split features (a norm's
  // squares) that every rank then uses on its own part.
  [[nodiscard]] at::Tensor sum(const at::Tensor& part);

  // The summed cross-entropy of [tokens, vocab / k] logits (this rank's slice of the vocabulary)
  // against whole-vocabulary targets (-100 left out), without gathering the logits: the row maxima,
  // the sums of exponentials and the targets' logits are exchanged instead. Differentiable in logits.
  [[nodiscard]] at::Tensor summed_cross_entropy(const at::Tensor& logits, const at::Tensor& targets);

  // Sums the gradient of `parameter` over the group as autograd computes it (gradient_summed).
  void sum_gradient_of(at::Tensor& parameter);

  // The group's collectives of a step as the split modules declare them (loom/schedule), in the dtype
  // the plan computes in, under the group's role ("tensor[2]"): each forward exchange in the order the
  // modules were split, the backward ones in reverse, a recomputed unit's forward ones again before
  // its backward. `recomputed`: the units recompute(...) chose.
  // Returns the index of the module's first exchange.
  std::size_t declare(const std::string& module, std::vector<parallel_module::exchange> exchanges);
  // A forward starts from the first declared exchange of forward; its backward from the last of backward.
  void begin_forward() noexcept;
  void begin_backward();
  // Throws std::logic_error, naming both, unless `exchange`, issued now in `phase` (forward, or
  // backward for a gradient's), is the one the schedule has next: a forward's in the declared order
  // (the order the model registered its split layers), a recomputed forward's any of the forward
  // ones, a backward's later than the last one issued (some may be passed over, none gone back to).
  void check_issued(std::size_t exchange, bool in_backward_pass);
  [[nodiscard]] std::vector<schedule_entry> schedule_entries(at::ScalarType compute_type,
                                                             const std::vector<std::string>& recomputed) const;

  // The model's parameters the split cut, by dotted name: each rank holds 1/k of them along `dim`;
  // every other parameter is whole on every rank of the group.
  void record(const split_parameter& cut);
  [[nodiscard]] const std::vector<split_parameter>& cut() const noexcept { return cut_; }
  [[nodiscard]] std::optional<std::int64_t> split_dim(const std::string& parameter) const;
  // The named tensors of this rank made whole (its split ones gathered over the group), in place; a
  // collective: every rank of the group calls it with the same names.
  void gather_whole(std::vector<named_tensor>& tensors) const;
  // Whole named tensors cut down to this rank's part, in place.
  void keep_parts(std::vector<named_tensor>& tensors) const;

 private:
  struct declared {
    std::string module;
    parallel_module::exchange exchange;
  };
  std::shared_ptr<tensor_group> group_;
  std::vector<split_parameter> cut_;
  std::map<std::string, std::int64_t> dim_of_;  // cut_ by name
  std::vector<declared> declared_;
  std::vector<std::size_t> forward_order_;   // the forward exchanges, in order
  std::vector<std::size_t> backward_order_;  // the backward exchanges, in the order backward issues them
  std::size_t next_forward_ = 0;
  std::size_t next_backward_ = 0;
  bool in_backward_ = false;
  [[nodiscard]] std::string describe(std::size_t exchange, step_phase phase) const;
};

// Splits `model`'s layers by `plan` over `split`'s group, and its attentions' heads; names
// `model_name` and the layer in every refusal (a pattern that matches nothing, a layer of another
// type, a dimension or a head count k does not divide).
void split_layers(torch::nn::Module& model, std::string_view model_name, const std::vector<parallel_layer>& plan,
                  const std::shared_ptr<tensor_split>& split);

}  // namespace loom::nn
