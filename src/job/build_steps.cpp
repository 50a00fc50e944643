#include <loom/job/build_steps.hpp>

#include <loom/base/text.hpp>
#include <loom/lora/adapter.hpp>
#include <loom/lora/lora.hpp>
#include <loom/nn/branch.hpp>
#include <loom/nn/linear.hpp>
#include <loom/nn/recompute.hpp>
#include <loom/nn/unit.hpp>
#include <loom/quant/quantized_weight.hpp>
#include <loom/replicas/replicas.hpp>
#include <loom/runtime/sequence_group.hpp>
#include <loom/runtime/tensor_group.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace loom::build_steps {

std::optional<std::uint64_t> seed(const stage_list& stages) {
  if (const auto stage = stages.find<seeded_stage>()) return stage->seed();
  return std::nullopt;
}

dtypes decide_dtypes(const stage_list& stages) {
  dtypes decided;
  if (const auto stage = stages.find<default_dtype_stage>()) decided.built_in = stage->type();
  if (const auto stage = stages.find<mixed_precision_stage>())
    decided.policy = precision_policy::from(stage->settings());
  return decided;
}

std::shared_ptr<pretrained_checkpoint> open_checkpoint(const stage_list& stages,
                                                       std::span<const std::string_view> components) {
  if (const auto stage = stages.find<pretrained_stage>()) {
    return std::make_shared<pretrained_checkpoint>(stage->path(), components);
  }
  return nullptr;
}

deferral judge_deferred(nn::deferred_init& deferred, const torch::nn::Module& model, bool seeded, std::string& why) {
  if (std::optional<std::string> reason = deferred.accept(model)) {
    why = std::move(*reason);
    if (!seeded) deferred.rewind_generator();
    return deferral::construct_whole;
  }
  return deferred.size() == 0 ? deferral::nothing_deferred : deferral::stands;
}

bool load_pretrained(pretrained_checkpoint& checkpoint, torch::nn::Module& model, bool read_later) {
  checkpoint.check(model, &lora_adapter::is_adapter_parameter);
  if (read_later) return false;
  checkpoint.copy_into(model, &lora_adapter::is_adapter_parameter);
  return true;
}

std::size_t set_what_trains(torch::nn::Module& model, std::string_view model_name, const lora_layers* lora,
                            std::span<const tied_parameter> tied, const stage_list& stages,
                            std::optional<dtype> built_in) {
  const auto trainable = stages.find<trainable_stage>();
  set_trainable(model, model_name, lora != nullptr, trainable ? trainable->patterns() : target_list{});
  if (lora != nullptr) lora->train_modules_to_save(model, model_name, tied);
  return built_in ? hold_trainable_in_fp32(model) : 0;
}

namespace {

// The values of a linear layer's weight `name`, whole, in its own dtype, from where they are.
at::Tensor weight_values(const std::string& name, const at::Tensor& weight, pretrained_checkpoint* unread,
                         nn::deferred_init* deferred) {
  if (unread != nullptr) return unread->read(name);
  if (deferred != nullptr && deferred->defers(weight) && !nn::has_bytes(weight)) {
    at::Tensor values = at::empty(weight.sizes(), at::TensorOptions().dtype(weight.scalar_type()));
    deferred->materialise({nn::row_request{name, weight, 0, weight.size(0), values}});
    return values;
  }
  return weight.detach();
}

// A layer's quantized parts without their bytes, recorded with the deferred construction: when the
// engine materialises a rank's rows of them, the checkpoint's weight is read whole and quantized,
// once for both parts, so that a rank holds one weight in the checkpoint's dtype at a time.
quant::quantized_weight deferred_parts(nn::deferred_init& deferred, std::shared_ptr<pretrained_checkpoint> checkpoint,
                                       const std::string& name, at::IntArrayRef shape,
                                       const quantized_options& options) {
  auto quantized = std::make_shared<std::optional<quant::quantized_weight>>();
  const auto part = [=](bool codes) {
    return nn::initializer{[=](at::Tensor& out) {
                             if (!*quantized)
                               *quantized = quant::quantized_weight::quantize(checkpoint->read(name), options);
                             out.copy_(codes ? (*quantized)->codes() : (*quantized)->statistics());
                             if (!codes) quantized->reset();  // the statistics are asked for after the codes
                           },
                           /*draws=*/false};
  };
  const auto sizes = quant::quantized_weight::sizes_of(shape, options);
  at::Tensor codes = deferred.add({sizes.codes}, at::kByte, part(true));
  at::Tensor statistics = deferred.add({sizes.statistics}, at::kByte, part(false));
  return quant::quantized_weight::from_parts(options, shape, std::move(codes), std::move(statistics));
}

}  // namespace

std::optional<quant::quantized_base> quantize_base(torch::nn::Module& model, std::string_view model_name,
                                                   std::span<const std::string_view> kept, const stage_list& stages,
                                                   const std::shared_ptr<pretrained_checkpoint>& unread,
                                                   nn::deferred_init* deferred) {
  const auto stage = stages.find<quantized_stage>();
  if (!stage) return std::nullopt;
  const quantized_options& options = stage->settings();
  quant::quantized_base made;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto* linear = item.value()->as<nn::LinearImpl>();
    const std::string dotted = fmt::format(".{}.", item.key());
    const bool is_kept = std::any_of(kept.begin(), kept.end(), [&](std::string_view name) {
      return dotted.find(fmt::format(".{}.", name)) != std::string::npos;
    });
    if (linear == nullptr || is_kept || linear->quantized()) continue;
    const std::string name = item.key() + ".weight";
    const at::Tensor weight = linear->weight;  // a handle: hold_quantized drops the layer's
    if (weight.requires_grad()) {
      throw_error<std::invalid_argument>(
          "quantized({}): {}'s '{}' trains (trainable(...) or lora's modules_to_save names it), and a quantized "
          "weight is frozen (loom R21): leave that layer out of them, and let LoRA's adapters train over it",
          name_of(options.format), model_name, name);
    }
    const bool from_checkpoint = unread && unread->holds(name);
    if (from_checkpoint && deferred != nullptr && deferred->defers(weight)) {
      linear->hold_quantized(deferred_parts(*deferred, unread, name, weight.sizes(), options));
    } else {
      linear->hold_quantized(quant::quantized_weight::quantize(
          weight_values(name, weight, from_checkpoint ? unread.get() : nullptr, deferred), options));
    }
    made.layers += 1;
    made.bytes += linear->quantized()->bytes();
    made.bf16_bytes += weight.numel() * 2;
  }
  if (made.layers == 0) {
    throw_error<std::invalid_argument>(
        "quantized({}): {} has no loom::nn::Linear to quantize but its output embeddings: build its linear layers "
        "with loom::nn::Linear (torch::nn::Linear's drop-in), or leave quantized(...) out",
        name_of(options.format), model_name);
  }
  return made;
}

std::vector<std::string> choose_recomputed_units(torch::nn::Module& model, const stage_list& stages) {
  if (const auto stage = stages.find<recompute_stage>()) return nn::recompute_units(model, stage->settings());
  return {};
}

namespace {

// A pass through a model with branches runs one of them, and a split's exchanges are declared for
// every attention or split layer of the model, checked in one order in every pass.
void refuse_branches(torch::nn::Module& model, std::string_view model_name, std::string_view stage, int size) {
  const std::vector<nn::branch_module> branches = nn::find_branches(model);
  if (branches.empty()) return;
  throw_error<std::invalid_argument>(
      "{}({}) with {}: the model has branches ('{}' and the rest), of which a pass runs one, and {}'s exchanges "
      "are checked in the same order in every pass, over every branch; leave {} out with this model (fsdp() "
      "shards it, issuing the taken branch's collectives alone)",
      stage, size, model_name, branches.front().name, stage, stage);
}

}  // namespace

std::shared_ptr<nn::sequence_split> split_sequences(torch::nn::Module& model, std::string_view model_name,
                                                    const stage_list& stages, const runtime& rt, const dtypes& types,
                                                    const std::vector<std::string>& recomputed_units) {
  const auto stage = stages.find<sequence_parallel_stage>();
  if (!stage || stage->settings().size == 1) return nullptr;
  const int size = static_cast<int>(stage->settings().size);
  refuse_branches(model, model_name, "sequence_parallel", size);
  auto group = std::make_shared<sequence_group>(rt, size);
  const nn::sequence_modules found = nn::find_sequence_modules(model);
  if (found.attentions.empty()) {
    throw_error<std::invalid_argument>(
        "sequence_parallel({}): {} has no loom::nn::Attention, around which each sequence's parts are exchanged: "
        "register one in each attention layer and call it with the layer's q, k and v (loom::models::CausalLM and "
        "loom::models::Wan do), or leave sequence_parallel out",
        size, model_name);
  }
  if (found.sequences.empty()) {
    throw_error<std::invalid_argument>(
        "sequence_parallel({}): {} has no loom::nn::Sequence, which splits its input: register one and pass the "
        "model's tokens through sequence->split(x, dim) where they enter, or leave sequence_parallel out",
        size, model_name);
  }
  const std::vector<nn::unit_module> units = nn::find_units(model);
  std::vector<nn::sequence_split::site> sites;
  for (const auto& [name, attention] : found.attentions) {
    nn::sequence_split::site& site = sites.emplace_back();
    site.name = name;
    site.options = attention->options();
    for (const nn::unit_module& unit : units) {
      if (!name.starts_with(unit.name + ".")) continue;
      site.unit = unit.name;
      site.recomputed =
          std::find(recomputed_units.begin(), recomputed_units.end(), unit.name) != recomputed_units.end();
    }
  }
  const at::ScalarType compute = types.policy     ? types.policy->param
                                 : types.built_in ? scalar_type(*types.built_in)
                                                  : at::kFloat;
  auto split = std::make_shared<nn::sequence_split>(std::move(group), std::move(sites), compute);
  for (std::size_t i = 0; i < found.attentions.size(); ++i) found.attentions[i].second->join(split, i);
  for (nn::SequenceImpl* sequence : found.sequences) sequence->join(split);
  return split;
}

bool splits_layers(const stage_list& stages) {
  const auto stage = stages.find<tensor_parallel_stage>();
  return stage && stage->settings().size > 1;
}

std::shared_ptr<nn::tensor_split> split_layers(torch::nn::Module& model, std::string_view model_name,
                                               const std::vector<nn::parallel_layer>& plan, const stage_list& stages,
                                               const runtime& rt) {
  if (!splits_layers(stages)) return nullptr;
  const int size = static_cast<int>(stages.find<tensor_parallel_stage>()->settings().size);
  if (const auto lora = stages.find<lora_stage>(); lora && lora->dropout() > 0) {
    throw_error<std::invalid_argument>(
        "tensor_parallel({}) with lora dropout {}: the ranks of a group share each layer's input, and each would "
        "drop its own elements of it; pass lora dropout 0 with tensor_parallel",
        size, lora->dropout());
  }
  refuse_branches(model, model_name, "tensor_parallel", size);
  auto split = std::make_shared<nn::tensor_split>(std::make_shared<tensor_group>(rt, size));
  nn::split_layers(model, model_name, plan, split);
  return split;
}

void read_slices(pretrained_checkpoint& checkpoint, const nn::tensor_split& split) {
  const std::vector<tensor_spec> specs = checkpoint.specs();
  std::map<std::string, const tensor_spec*> by_name;
  for (const tensor_spec& spec : specs) by_name.emplace(spec.name, &spec);
  std::map<std::string, tensor_slice> slices;
  for (const nn::split_parameter& cut : split.cut()) {
    const auto found = by_name.find(cut.name);
    if (found == by_name.end()) continue;  // an adapter's, which the checkpoint does not hold
    const std::int64_t whole = found->second->shape.at(static_cast<std::size_t>(cut.dim));
    slices.emplace(cut.name, tensor_slice{cut.dim, split.slice_begin(whole), whole / split.size()});
  }
  checkpoint.read_slices(slices);
}

void move_to_device(torch::nn::Module& model, const runtime& rt, nn::deferred_init* deferred) {
  if (deferred != nullptr) {
    nn::to_device(model, rt.device());
  } else {
    model.to(rt.device());
  }
}

void check_or_broadcast_replicas(const runtime& rt, torch::nn::Module& model, std::optional<std::uint64_t> seed,
                                 nn::deferred_init* deferred) {
  if (seed) {
    verify_identical_replicas(rt, model, *seed);
  } else {
    broadcast_replicas(rt, model, deferred);
  }
  if (deferred != nullptr) deferred->set_advances_generator(!seed);
}

}  // namespace loom::build_steps
