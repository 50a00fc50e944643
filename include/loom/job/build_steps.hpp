// The steps of loom::build that depend on neither the model's type nor the strategy, compiled once
// (src/job/build_steps.cpp). build_checked (loom/job/build.hpp) takes them in this order, with the
// typed construction between open_checkpoint and load_pretrained; each says what it reads and gives.
#pragma once

#include <loom/dsl/dtype.hpp>
#include <loom/dsl/stage_list.hpp>
#include <loom/io/weights.hpp>
#include <loom/lora/lora.hpp>
#include <loom/nn/deferred_init.hpp>
#include <loom/nn/sequence_parallel.hpp>
#include <loom/nn/tensor_parallel.hpp>
#include <loom/precision/precision.hpp>
#include <loom/quant/quantized_weight.hpp>
#include <loom/runtime/runtime.hpp>

#include <torch/nn/module.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::build_steps {

// seeded(...)'s seed, if the plan has one.
[[nodiscard]] std::optional<std::uint64_t> seed(const stage_list& stages);

struct dtypes {
  std::optional<dtype> built_in;           // default_dtype(...): what the model is built in
  std::optional<precision_policy> policy;  // mixed_precision(...)
};
[[nodiscard]] dtypes decide_dtypes(const stage_list& stages);

// pretrained(...)'s checkpoint with every header read and checked, before the model is constructed:
// a missing or truncated file stops the build at once. None without the stage. For a model made of a
// pipeline's components (its static pretrained_components, Wan 2.2 A14B's transformer and
// transformer_2), each component's folder in the stage's, its tensors under "<component>.".
[[nodiscard]] std::shared_ptr<pretrained_checkpoint> open_checkpoint(const stage_list& stages,
                                                                     std::span<const std::string_view> components = {});

// Whether a construction without bytes stands (loom/nn/deferred_init.hpp). It does not when a layer
// drew from the generator or wrote a deferred parameter: then `why` names it, and without seeded(...)
// the default generator is put back where the construction found it, so that the construction whole
// draws the same stream (a seeded construction forks its own stream, the same both times).
enum class deferral { stands, nothing_deferred, construct_whole };
[[nodiscard]] deferral judge_deferred(nn::deferred_init& deferred, const torch::nn::Module& model, bool seeded,
                                      std::string& why);

// Checks the checkpoint against the model (adapters aside) and reads it into it, unless `read_later`:
// a sharding engine reads each rank's part in its setup, and a model whose layers are split reads its
// slices once split. Returns whether the checkpoint was read here.
[[nodiscard]] bool load_pretrained(pretrained_checkpoint& checkpoint, torch::nn::Module& model, bool read_later);

// Freezes what neither LoRA (its adapters and modules_to_save) nor trainable(...) names; under
// default_dtype(...), holds the trainable parameters it built narrower in fp32. Returns how many it
// held so. `tied`: the model's parameters that read others, named in modules_to_save's refusals.
[[nodiscard]] std::size_t set_what_trains(torch::nn::Module& model, std::string_view model_name,
                                          const lora_layers* lora, std::span<const tied_parameter> tied,
                                          const stage_list& stages, std::optional<dtype> built_in);

// quantized(...): every loom::nn::Linear of the model but those `kept` names (a dotted part of the
// layer's name: the output embeddings, which transformers' quantizers keep as lm_head, and what the
// model keeps in full precision) holds its weight quantized, one layer at a time. A weight the engine would read from
// the `unread` checkpoint later, into a construction without bytes, gets parts without bytes that its rows are
// materialised into (each weight read whole and quantized then); any other is quantized now, from the checkpoint's
// tensor, its deferred record, or itself. A layer whose weight trains (trainable(...), modules_to_save) is refused with
// R21's reason. Returns the layers' count and bytes, for job.describe(); none without the stage.
[[nodiscard]] std::optional<quant::quantized_base> quantize_base(torch::nn::Module& model, std::string_view model_name,
                                                                 std::span<const std::string_view> kept,
                                                                 const stage_list& stages,
                                                                 const std::shared_ptr<pretrained_checkpoint>& unread,
                                                                 nn::deferred_init* deferred);

// recompute(...)'s units, by name; none without the stage.
[[nodiscard]] std::vector<std::string> choose_recomputed_units(torch::nn::Module& model, const stage_list& stages);

// sequence_parallel(k)'s split, joined to every loom::nn::Attention and loom::nn::Sequence of the
// model; none without the stage or with k = 1. Throws, naming the fix, when k does not divide the
// world size or an attention's heads, or the model has no Attention or no Sequence to split around.
[[nodiscard]] std::shared_ptr<nn::sequence_split> split_sequences(torch::nn::Module& model, std::string_view model_name,
                                                                  const stage_list& stages, const runtime& rt,
                                                                  const dtypes& types,
                                                                  const std::vector<std::string>& recomputed_units);

// Whether the plan splits layers across ranks (tensor_parallel(k), k > 1): the model is then built
// whole on every rank and split once the replicas are checked, and pretrained(...) read after that,
// each rank reading its slices (read_slices).
[[nodiscard]] bool splits_layers(const stage_list& stages);

// tensor_parallel(k)'s split of the model's layers that `plan` marks (its tensor_parallel_plan()),
// and of its attentions' heads, over groups of k consecutive ranks; none without the stage or with
// k = 1. Throws, naming the fix, when k does not divide the world size, a head count or a split
// dimension, when the model marks no layer, and for an adapter with dropout (each rank would draw
// its own mask over the input that the group's ranks share).
[[nodiscard]] std::shared_ptr<nn::tensor_split> split_layers(torch::nn::Module& model, std::string_view model_name,
                                                             const std::vector<nn::parallel_layer>& plan,
                                                             const stage_list& stages, const runtime& rt);

// To the runtime's device; a deferred construction moves its records, not bytes it does not have.
// pretrained(...)'s tensors that `split` cut, read as this rank's slices from now on.
void read_slices(pretrained_checkpoint& checkpoint, const nn::tensor_split& split);

void move_to_device(torch::nn::Module& model, const runtime& rt, nn::deferred_init* deferred);

// With a seed every rank built the same replica, which a fingerprint checks; without, rank 0's
// values are broadcast (deferred: its generator's state, which every rank's records replay from).
// Then, without a seed, a deferred construction's materialisation leaves the default generator
// past its draws, as a construction whole would have.
void check_or_broadcast_replicas(const runtime& rt, torch::nn::Module& model, std::optional<std::uint64_t> seed,
                                 nn::deferred_init* deferred);

}  // namespace loom::build_steps
