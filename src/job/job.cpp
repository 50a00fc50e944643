#include <loom/job/job.hpp>

#include <loom/base/text.hpp>
#include <loom/io/peft.hpp>
#include <loom/lora/peft_adapter.hpp>
#include <loom/nn/linear.hpp>
#include <loom/nn/sequence_parallel.hpp>
#include <loom/nn/tensor_parallel.hpp>
#include <loom/quant/quantized_weight.hpp>
#include <loom/runtime/failures.hpp>
#include <loom/runtime/sequence_group.hpp>
#include <loom/runtime/tensor_group.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/types.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <stdexcept>
#include <type_traits>

namespace loom {

namespace detail {

job_core::job_core(runtime rt, std::shared_ptr<torch::nn::Module> module, std::string model_name,
                   std::optional<lora_layers> lora, std::string plan_text, const build_decisions& decided)
    : context_(decided.tensor_split
                   ? std::make_unique<strategy_context>(decided.tensor_split->group().data_parallel(),
                                                        std::move(module), decided.policy, std::move(rt))
                   : std::make_unique<strategy_context>(std::move(rt), std::move(module), decided.policy)),
      model_name_(std::move(model_name)),
      lora_(std::move(lora)),
      plan_text_(std::move(plan_text)),
      plan_state_(decided.plan_state.empty() ? plan_text_ : decided.plan_state),
      sequence_split_(decided.sequence_split),
      tensor_split_(decided.tensor_split),
      recomputed_units_(decided.recomputed_units),
      compute_type_(decided.policy     ? decided.policy->param
                    : decided.built_in ? scalar_type(*decided.built_in)
                                       : at::kFloat),
      identity_(decided.identity) {
  if (decided.pretrained) {
    // PEFT loads a base model from a folder: the checkpoint's, for a single file.
    const std::filesystem::path& path = decided.pretrained->path();
    base_model_ = std::filesystem::absolute(std::filesystem::is_directory(path) ? path : path.parent_path());
    for (const tensor_spec& spec : decided.pretrained->specs()) pretrained_dtypes_.emplace(spec.name, spec.dtype);
    weights_naming_ = decided.pretrained->naming();
    pretrained_fingerprint_ = decided.pretrained->fingerprint();
  }
  if (decided.built_in) {
    built_text_ = fmt::format("built in {}", name_of(*decided.built_in));
    if (decided.trainable_held_in_fp32 > 0) {
      built_text_ += fmt::format(", the {} that train held in fp32",
                                 counted(static_cast<std::int64_t>(decided.trainable_held_in_fp32), "parameter"));
    }
  }
  context_->initial_values() = initial_values(decided.pretrained, decided.pretrained_read, decided.deferred);
  if (!decided.constructed_whole.empty()) {
    // Said once, as well as in describe(): the memory it costs is the user's to know of.
    std::string line = fmt::format("constructed whole on every rank: {}", decided.constructed_whole);
    if (context_->world().rank() == 0) fmt::print(stderr, "{}\n", error_message("{}", line));
    context_->note(std::move(line));
  }
  if (sequence_split_) {
    const sequence_group& group = sequence_split_->group();
    context_->note(fmt::format(
        "sequence parallel: {} a sequence (this rank's group {}: ranks {}), each keeping 1/{} of its tokens; {} "
        "in all, each reading its own batches",
        counted(group.size(), "rank"), group.name(), fmt::join(group.ranks(), ", "), group.size(),
        counted(group.data_world_size(), "group")));
  }
  if (tensor_split_) {
    context_->split_by(tensor_split_);
    const tensor_group& group = tensor_split_->group();
    context_->note(fmt::format(
        "tensor parallel: each parallel layer split over {} (this rank's group {}: ranks {}), each holding 1/{} of "
        "it; the strategy runs over {} ({}: ranks {})",
        counted(group.size(), "rank"), group.name(), fmt::join(group.ranks(), ", "), group.size(),
        counted(group.data_world_size(), "data-parallel rank"), group.data_parallel_name(),
        fmt::join(group.data_parallel_ranks(), ", ")));
  }
  if (decided.quantized) {
    constexpr double mib = 1 << 20;
    context_->note(fmt::format(
        "quantized: {}, {:.2f} MiB held for {:.2f} MiB in bf16 ({:.3f} of it)",
        counted(static_cast<std::int64_t>(decided.quantized->layers), "linear layer"),
        static_cast<double>(decided.quantized->bytes) / mib, static_cast<double>(decided.quantized->bf16_bytes) / mib,
        static_cast<double>(decided.quantized->bytes) / static_cast<double>(decided.quantized->bf16_bytes)));
  }
  if (!decided.recomputed_units.empty()) {
    context_->note(fmt::format("recompute: {} in backward: {}",
                               counted(static_cast<std::int64_t>(decided.recomputed_units.size()), "unit"),
                               fmt::join(decided.recomputed_units, ", ")));
  }
}

int job_core::data_rank() const noexcept {
  if (sequence_split_) return sequence_split_->group().data_rank();
  if (tensor_split_) return tensor_split_->group().data_rank();
  return context_->world().rank();
}

int job_core::data_world_size() const noexcept {
  if (sequence_split_) return sequence_split_->group().data_world_size();
  if (tensor_split_) return tensor_split_->group().data_world_size();
  return context_->world().world_size();
}

int job_core::tensor_parallel_size() const noexcept { return tensor_split_ ? tensor_split_->size() : 1; }

void job_core::gather_split(tensor_state& state) const {
  if (tensor_split_) tensor_split_->gather_whole(state);
}

tensor_state job_core::split_parts(tensor_state state) const {
  if (tensor_split_) tensor_split_->keep_parts(state);
  return state;
}

std::map<std::string, tensor_layout> job_core::whole_layouts() const {
  std::map<std::string, tensor_layout> layouts;
  for (const named_tensor& t : module_state(context_->module())) {
    tensor_layout layout{.shape = t.tensor.sizes().vec(), .split_dim = std::nullopt};
    if (tensor_split_) layout.split_dim = tensor_split_->split_dim(t.name);
    if (layout.split_dim) layout.shape[static_cast<std::size_t>(*layout.split_dim)] *= tensor_split_->size();
    layouts.emplace(t.name, std::move(layout));
  }
  return layouts;
}

at::Tensor job_core::split_part(const std::string& name, const at::Tensor& whole) const {
  if (!tensor_split_) return whole;
  const std::optional<std::int64_t> dim = tensor_split_->split_dim(name);
  return dim ? tensor_split_->slice(whole, *dim) : whole;
}

void job_core::finish_initial_values() {
  for (std::string& line : context_->initial_values().finish()) context_->note(std::move(line));
}

namespace {

// "schedule entries #0-#2, #5: all_reduce, broadcast": the entries of `phase`, or "" when it has none.
std::string entries_of(const collective_schedule& schedule, step_phase phase) {
  std::vector<std::string> ranges;
  std::vector<std::string_view> ops;
  const auto entries = schedule.entries();
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].phase != phase) continue;
    std::size_t last = i;
    while (last + 1 < entries.size() && entries[last + 1].phase == phase) ++last;
    ranges.push_back(last == i ? fmt::format("#{}", i) : fmt::format("#{}-#{}", i, last));
    for (std::size_t j = i; j <= last; ++j) {
      if (std::find(ops.begin(), ops.end(), to_string(entries[j].op)) == ops.end())
        ops.push_back(to_string(entries[j].op));
    }
    i = last;
  }
  if (ranges.empty()) return {};
  return fmt::format("schedule {} {}: {}",
                     ranges.size() == 1 && ranges.front().find('-') == std::string::npos ? "entry" : "entries",
                     fmt::join(ranges, ", "), fmt::join(ops, ", "));
}

}  // namespace

void job_core::set_up(function_ref<void(strategy_context&)> setup, bool engine_casts) {
  if (const std::optional<precision_policy>& policy = context_->precision()) {
    // An engine that casts the parameters computes in param from its inputs on; else autocast does.
    casting_ = {.autocast = engine_casts ? std::nullopt : std::optional(policy->param),
                .inputs = engine_casts && policy->cast_forward_inputs ? std::optional(policy->param) : std::nullopt,
                .output = policy->output};
    context_->note(
        fmt::format("mixed precision: {}, gradients reduced in {}{}",
                    engine_casts ? fmt::format("the strategy casts the parameters to {} for forward and backward",
                                               c10::toString(policy->param))
                                 : fmt::format("the forward under autocast({})", c10::toString(policy->param)),
                    c10::toString(policy->reduce),
                    policy->output ? fmt::format(", the forward's result cast to {}", c10::toString(*policy->output))
                                   : std::string()));
  }
  setup(*context_);
  if (sequence_split_) {
    for (schedule_entry& entry : sequence_split_->schedule_entries()) context_->schedule().add(std::move(entry));
  }
  if (tensor_split_) {
    for (schedule_entry& entry : tensor_split_->schedule_entries(compute_type_, recomputed_units_)) {
      context_->schedule().add(std::move(entry));
    }
  }
  verify_schedule_across_ranks(context_->schedule(), context_->world());
  built_schedule_ = context_->schedule();
}

namespace {

// This rank is in a part of a pass until the scope ends.
class [[nodiscard]] part_scope {
 public:
  part_scope(job_progress& progress, pass_part part, const std::string& collectives) : progress_(progress) {
    progress_.enter(part, !collectives.empty(), collectives);
  }
  ~part_scope() { progress_.leave_part(); }
  part_scope(const part_scope&) = delete;
  part_scope& operator=(const part_scope&) = delete;

 private:
  job_progress& progress_;
};

}  // namespace

void job_core::run_part(pass_part part, function_ref<void()> body, function_ref<void(std::exception_ptr)> explain) {
  const bool forward = part == pass_part::forward;
  // Read from the schedule each pass: an engine may rebuild it after the first step (ddp()'s buckets).
  const std::string collectives =
      context_->world().is_distributed()
          ? entries_of(context_->schedule(), forward ? step_phase::forward : step_phase::backward)
          : std::string();
  const part_scope in_part(context_->world().progress(), part, collectives);
  try {
    if (sequence_split_) {
      if (forward) {
        sequence_split_->begin_forward();
      } else {
        sequence_split_->begin_backward();
      }
    }
    if (tensor_split_) {
      if (forward) {
        tensor_split_->begin_forward();
      } else {
        tensor_split_->begin_backward();
      }
    }
    body();
  } catch (...) {
    if (explain) explain(std::current_exception());
    rethrow_as_job_failure(context_->world(), std::current_exception(), forward ? "forward pass" : "backward pass");
  }
}

void job_core::run_outside_pass(std::string_view during, function_ref<void()> body) {
  try {
    body();
  } catch (...) {
    rethrow_as_job_failure(context_->world(), std::current_exception(), during);
  }
}

lora_layers& job_core::require_lora(std::string_view what) {
  if (lora_) return *lora_;
  throw_error<std::logic_error>("job.{}() needs a plan with lora(...)", what);
}

namespace {

// The part of `whole` (the model's adapter) that concerns the pipeline's component `component`, named
// as that component names its layers: the tensors and layers under "<component>." without the
// prefix, and the rank and alpha patterns but those keyed under another component's name (one keyed
// under its own loses the prefix).
peft_lora_adapter component_part(const peft_lora_adapter& whole, const std::string& component,
                                 const std::vector<std::string>& components) {
  const std::string prefix = component + ".";
  const auto unprefixed = [&](const std::string& name) -> std::optional<std::string> {
    if (!name.starts_with(prefix)) return std::nullopt;
    return name.substr(prefix.size());
  };
  const auto of_another = [&](const std::string& key) {
    return std::any_of(components.begin(), components.end(),
                       [&](const std::string& other) { return other != component && key.starts_with(other + "."); });
  };
  const auto patterns = [&](const auto& given) {
    std::remove_cvref_t<decltype(given)> kept;
    for (const auto& [key, value] : given) {
      if (!of_another(key)) kept.emplace_back(unprefixed(key).value_or(key), value);
    }
    return kept;
  };
  const auto tensors = [&](const std::vector<named_tensor>& given) {
    std::vector<named_tensor> kept;
    for (const named_tensor& t : given) {
      if (auto name = unprefixed(t.name)) kept.push_back({std::move(*name), t.tensor});
    }
    return kept;
  };
  peft_lora_adapter part = whole;
  part.rank_pattern = patterns(whole.rank_pattern);
  part.alpha_pattern = patterns(whole.alpha_pattern);
  part.tensors = tensors(whole.tensors);
  part.module_tensors = tensors(whole.module_tensors);
  part.target_modules.clear();
  for (const std::string& layer : whole.target_modules) {
    if (auto name = unprefixed(layer)) part.target_modules.push_back(std::move(*name));
  }
  return part;
}

// The adapters of a pipeline's components, read from their folders under `path`, as one adapter of
// the model: each one's names under its component's prefix, its patterns confined to its component.
// The plan's lora(...) has one rank, alpha and use_rslora: components that differ in them are refused.
peft_lora_adapter joined_components(const std::vector<std::pair<std::string, peft_lora_adapter>>& parts,
                                    const std::filesystem::path& path) {
  peft_lora_adapter joined = parts.front().second;
  joined.rank_pattern.clear();
  joined.alpha_pattern.clear();
  joined.tensors.clear();
  joined.module_tensors.clear();
  joined.target_modules.clear();
  joined.modules_to_save.clear();
  const auto& [first_component, first] = parts.front();
  for (const auto& [component, part] : parts) {
    if (part.r != first.r || part.lora_alpha != first.lora_alpha || part.use_rslora != first.use_rslora) {
      throw_error<std::invalid_argument>(
          "job.load_adapter('{}'): the adapters of {} and {} differ in rank, alpha or use_rslora (r = {} and {}, "
          "lora_alpha = {} and {}), and the plan's lora(...) gives every component the same; save them with one",
          path.string(), first_component, component, first.r, part.r, first.lora_alpha, part.lora_alpha);
    }
    // A key matches the end of a layer's name (PEFT's rule): under the component, at any depth.
    const auto confined = [&](const std::string& key) { return fmt::format("{}\\.(?:.*\\.)?(?:{})", component, key); };
    for (const auto& [key, rank] : part.rank_pattern) joined.rank_pattern.emplace_back(confined(key), rank);
    for (const auto& [key, alpha] : part.alpha_pattern) joined.alpha_pattern.emplace_back(confined(key), alpha);
    const auto prefixed = [&](const std::string& name) { return fmt::format("{}.{}", component, name); };
    for (const named_tensor& t : part.tensors) joined.tensors.push_back({prefixed(t.name), t.tensor});
    for (const named_tensor& t : part.module_tensors) joined.module_tensors.push_back({prefixed(t.name), t.tensor});
    for (const std::string& layer : part.target_modules) joined.target_modules.push_back(prefixed(layer));
    for (const std::string& module : part.modules_to_save) {
      if (std::find(joined.modules_to_save.begin(), joined.modules_to_save.end(), module) ==
          joined.modules_to_save.end())
        joined.modules_to_save.push_back(module);
    }
  }
  return joined;
}

}  // namespace

std::string_view job_core::diffusers_component(std::string_view what) const {
  if (identity_.diffusers_component.empty()) {
    throw_error<std::logic_error>(
        "job.{}(..., adapter_format::diffusers): {} names no diffusers_component, the name of its pipeline's "
        "component that a diffusers LoRA file prefixes its keys with; use PEFT's folder (adapter_format::peft)",
        what, model_name_);
  }
  return identity_.diffusers_component;
}

void job_core::save_adapter(const std::filesystem::path& folder, adapter_format format) {
  const lora_layers& lora = require_lora("save_adapter");
  if (lora.merged()) {
    throw_error<std::logic_error>(
        "job.save_adapter(): the adapters are merged into the base weights, so a model that loads this "
        "adapter would apply it twice; call job.unmerge() first, or save the merged model with job.save_weights()");
  }
  if (format == adapter_format::diffusers && !lora.modules_to_save().empty()) {
    throw_error<std::logic_error>(
        "job.save_adapter(..., adapter_format::diffusers): a diffusers LoRA file carries no modules_to_save ({}); "
        "save PEFT's folder (adapter_format::peft)",
        detail::to_text(lora.modules_to_save()));
  }
  const std::string_view component =
      format == adapter_format::diffusers ? diffusers_component("save_adapter") : std::string_view();
  peft_lora_adapter adapter = to_peft_adapter(lora, context_->module(), identity_.tied);
  gather_split(adapter.tensors);
  gather_split(adapter.module_tensors);
  adapter.task_type = identity_.peft_task_type;
  adapter.base_model_name_or_path = base_model_.string();
  adapter.base_model_class = identity_.peft_base_model_class;
  adapter.parent_library = identity_.peft_parent_library;
  const auto save = [&](const std::filesystem::path& into, const peft_lora_adapter& what) {
    if (format == adapter_format::diffusers) {
      save_diffusers_lora(into, what, component);
    } else {
      save_peft_adapter(into, what);
    }
  };
  run_on_rank_zero(context_->world(), "saving the adapter", [&] {
    if (identity_.components.empty()) {
      save(folder, adapter);
      return;
    }
    // One adapter a component, in its folder: what diffusers loads into that component
    // (load_lora_weights(folder, subfolder=component), with load_into_transformer_2 for transformer_2)
    // and PEFT into that component's model.
    for (const std::string& name : identity_.components) {
      peft_lora_adapter part = component_part(adapter, name, identity_.components);
      if (!base_model_.empty()) part.base_model_name_or_path = (base_model_ / name).string();
      save(folder / name, part);
    }
  });
}

void job_core::load_adapter(const std::filesystem::path& path, adapter_format format) {
  const lora_layers& lora = require_lora("load_adapter");
  if (lora.merged()) {
    throw_error<std::logic_error>(
        "job.load_adapter(): the adapters are merged into the base weights; call "
        "job.unmerge() first");
  }
  const auto load = [&](const std::filesystem::path& from) {
    return format == adapter_format::diffusers ? load_diffusers_lora(from, diffusers_component("load_adapter"))
                                               : load_peft_adapter(from);
  };
  peft_lora_adapter adapter;
  if (identity_.components.empty()) {
    adapter = load(path);
  } else {
    std::vector<std::pair<std::string, peft_lora_adapter>> parts;
    for (const std::string& name : identity_.components) {
      if (!std::filesystem::is_directory(path / name)) {
        throw_error<std::invalid_argument>(
            "job.load_adapter('{}'): {} is made of a pipeline's components ({}), whose adapter job.save_adapter() "
            "writes one folder a component, and '{}' is not a folder: give the folder that holds them",
            path.string(), model_name_, fmt::join(identity_.components, ", "), (path / name).string());
      }
      parts.emplace_back(name, load(path / name));
    }
    adapter = joined_components(parts, path);
  }
  adapter.tensors = split_parts(std::move(adapter.tensors));
  adapter.module_tensors = split_parts(std::move(adapter.module_tensors));
  copy_peft_adapter_into(lora, context_->module(), adapter, path, identity_.tied);
}

namespace {

// `whole` as a Hugging Face model holds it: each quantized layer's parts as the weight they hold,
// under its own name (nn::LinearImpl::saved_weight), where the codes were.
tensor_state dequantized(const tensor_state& whole, torch::nn::Module& module) {
  std::map<std::string, const nn::LinearImpl*> quantized;
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    const auto* linear = item.value()->as<nn::LinearImpl>();
    if (linear != nullptr && linear->quantized()) quantized.emplace(item.key(), linear);
  }
  if (quantized.empty()) return whole;
  std::map<std::string, at::Tensor> statistics;
  // fmt::format rather than "." + std::string: GCC 12 takes the latter, inlined, for an overlapping copy (-Wrestrict).
  const std::string statistics_suffix = fmt::format(".{}", quant::quantized_weight::statistics_name);
  const std::string codes_suffix = fmt::format(".{}", quant::quantized_weight::codes_name);
  for (const named_tensor& t : whole) {
    if (t.name.ends_with(statistics_suffix))
      statistics.emplace(t.name.substr(0, t.name.size() - statistics_suffix.size()), t.tensor);
  }
  tensor_state saved;
  for (const named_tensor& t : whole) {
    if (t.name.ends_with(statistics_suffix)) continue;
    const std::string layer =
        t.name.ends_with(codes_suffix) ? t.name.substr(0, t.name.size() - codes_suffix.size()) : "";
    const auto found = quantized.find(layer);
    if (layer.empty() || found == quantized.end()) {
      saved.push_back(t);
      continue;
    }
    saved.push_back({layer + ".weight", found->second->saved_weight(t.tensor, statistics.at(layer))});
  }
  return saved;
}

}  // namespace

void job_core::save_weights(const std::filesystem::path& folder, const tensor_state& whole,
                            std::int64_t max_shard_bytes) {
  std::vector<named_tensor> base;
  for (named_tensor& t : dequantized(whole, context_->module())) {
    if (!lora_adapter::is_adapter_parameter(t.name)) base.push_back(std::move(t));
  }
  run_on_rank_zero(context_->world(), "saving the weights", [&] {
    if (identity_.components.empty()) {
      loom::save_weights(folder, base, max_shard_bytes, weights_naming_);
      return;
    }
    // A pipeline's components each in its folder, under its own names: what pretrained(folder) reads back.
    for (const std::string& component : identity_.components) {
      const std::string prefix = component + ".";
      std::vector<named_tensor> part;
      for (const named_tensor& t : base) {
        if (t.name.starts_with(prefix)) part.push_back({t.name.substr(prefix.size()), t.tensor});
      }
      loom::save_weights(folder / component, part, max_shard_bytes, weights_naming_);
    }
  });
}

void job_core::save_pretrained(const std::filesystem::path& folder, const tensor_state& whole,
                               std::int64_t max_shard_bytes) {
  if (base_model_.empty()) {
    throw_error<std::logic_error>(
        "job.save_pretrained(): the plan has no pretrained(...) checkpoint to take config.json and the dtypes from; "
        "save the weights alone with job.save_weights()");
  }
  if (lora_ && !lora_->merged()) {
    throw_error<std::logic_error>(
        "job.save_pretrained(): the adapters are not merged, and a Hugging Face model has none: call job.merge() "
        "first, or save the adapter itself with job.save_adapter()");
  }
  tensor_state cast;
  for (const named_tensor& t : dequantized(whole, context_->module())) {
    const auto saved = pretrained_dtypes_.find(t.name);
    const bool recast = saved != pretrained_dtypes_.end() && saved->second != t.tensor.scalar_type() &&
                        at::isFloatingType(saved->second) && at::isFloatingType(t.tensor.scalar_type());
    cast.push_back({t.name, recast ? t.tensor.to(saved->second) : t.tensor});
  }
  save_weights(folder, cast, max_shard_bytes);
  run_on_rank_zero(context_->world(), "copying the model's files", [&] {
    if (identity_.components.empty()) {
      (void)copy_model_files(base_model_, folder);
      return;
    }
    (void)copy_pipeline_files(base_model_, folder, identity_.components);
    for (const std::string& component : identity_.components) {
      (void)copy_model_files(base_model_ / component, folder / component);
    }
  });
}

void job_core::zero_grad(const std::vector<at::Tensor>& parameters, bool set_to_none) {
  for (const at::Tensor& p : parameters) {
    at::Tensor& grad = p.mutable_grad();
    if (!grad.defined()) continue;
    if (set_to_none) {
      grad.reset();
    } else {
      grad.zero_();
    }
  }
}

std::vector<std::string> job_core::frozen_names() const {
  std::vector<std::string> names;
  for (const auto& item : context_->module().named_parameters()) {
    if (!item.value().requires_grad()) names.push_back(item.key());
  }
  return names;
}

std::string job_core::describe() const {
  std::int64_t total = 0;
  std::int64_t trainable = 0;
  for (const auto& p : context_->module().parameters()) {
    total += p.numel();
    if (p.requires_grad()) trainable += p.numel();
  }
  std::string text = plan_text_;
  const runtime& rt = context_->world();
  text += fmt::format("build: {} on {}{}, device {}\n", model_name_, counted(rt.world_size(), "rank"),
                      rt.is_distributed() ? fmt::format(" ({})", to_string(rt.backend())) : std::string(),
                      rt.device().str());
  if (lora_) {
    text += fmt::format(
        "build: lora adapted {} ({} on the loom::nn::Linear fast path, {} on the torch::nn::Linear "
        "fallback)\n",
        counted(static_cast<std::int64_t>(lora_->adapted().size()), "layer"), lora_->fast_path_count(),
        lora_->fallback_count());
  }
  text += fmt::format("build: {} of {} parameters trainable ({})\n", trainable, total,
                      counted(static_cast<std::int64_t>(context_->trainable().size()), "tensor"));
  if (!built_text_.empty()) text += "build: " + built_text_ + '\n';
  for (const std::string& line : context_->notes()) text += "build: " + line + '\n';
  const collective_schedule& schedule = context_->schedule();
  const std::int64_t per_token = schedule.bytes_per_token();
  text += fmt::format(
      "build: schedule {} a step, {} bytes{}, fingerprint {:016x}\n",
      counted(static_cast<std::int64_t>(schedule.entries().size()), "collective"), schedule.bytes_per_step(),
      per_token > 0 ? fmt::format(" and {} bytes a token of the sequence", per_token) : "", schedule.fingerprint());
  return text;
}

}  // namespace detail
}  // namespace loom
