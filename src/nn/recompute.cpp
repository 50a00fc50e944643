#include <loom/nn/recompute.hpp>

#include <loom/base/text.hpp>
#include <loom/nn/unit.hpp>
#include <loom/precision/precision.hpp>

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/custom_class.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <utility>

namespace loom::nn {
namespace {

constexpr std::array autocast_devices{c10::DeviceType::CPU, c10::DeviceType::CUDA};

// Sets each generator to a saved state for a scope, and puts back the state it had.
template <class State>
class [[nodiscard]] generators_replayed {
 public:
  explicit generators_replayed(const std::vector<State>& saved) {
    for (const State& each : saved) {
      at::Generator generator = each.generator;
      const std::lock_guard<std::mutex> lock(generator.mutex());
      current_.push_back({generator, generator.get_state()});
      generator.set_state(each.state);
    }
  }
  ~generators_replayed() {
    for (State& each : current_) {
      const std::lock_guard<std::mutex> lock(each.generator.mutex());
      each.generator.set_state(each.state);
    }
  }
  generators_replayed(const generators_replayed&) = delete;
  generators_replayed& operator=(const generators_replayed&) = delete;

 private:
  std::vector<State> current_;
};

// What the replay needs in backward: autograd keeps it in the node's context, as a capsule.
struct replay_state : torch::CustomClassHolder {
  replay_state(replay_forward forward_, std::vector<at::Tensor> parameters_, forward_conditions conditions_)
      : forward(std::move(forward_)), parameters(std::move(parameters_)), conditions(std::move(conditions_)) {}
  replay_forward forward;
  std::vector<at::Tensor> parameters;
  forward_conditions conditions;
};

struct recomputation : torch::autograd::Function<recomputation> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* context,
                                                const c10::intrusive_ptr<replay_state>& replay, at::TensorList inputs,
                                                at::TensorList /*parameters*/) {
    std::vector<at::Tensor> arguments = inputs.vec();
    context->save_for_backward(arguments);
    context->saved_data["replay"] = c10::IValue::make_capsule(replay);
    return replay->forward(arguments);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 const torch::autograd::variable_list& grad_outputs) {
    const auto replay = c10::static_intrusive_pointer_cast<replay_state>(context->saved_data["replay"].toCapsule());
    const torch::autograd::variable_list saved = context->get_saved_variables();
    const std::size_t input_count = saved.size();
    std::vector<at::Tensor> detached;
    for (std::size_t i = 0; i < input_count; ++i) {
      detached.push_back(saved[i].detach().requires_grad_(context->needs_input_grad(i)));
    }
    std::vector<at::Tensor> outputs;
    replay->conditions.replay([&] { outputs = replay->forward(detached); });
    torch::autograd::variable_list roots, root_grads;
    for (std::size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (!outputs[i].defined() || !outputs[i].requires_grad() || !grad_outputs[i].defined()) continue;
      roots.push_back(outputs[i]);
      root_grads.push_back(grad_outputs[i]);
    }
    torch::autograd::variable_list targets;
    std::vector<std::size_t> slots;
    for (std::size_t i = 0; i < input_count + replay->parameters.size(); ++i) {
      if (!context->needs_input_grad(i)) continue;
      targets.push_back(i < input_count ? detached[i] : replay->parameters[i - input_count]);
      slots.push_back(i);
    }
    // One gradient a forward argument: none for the replay, then the inputs', then the parameters'.
    torch::autograd::variable_list grads(1 + input_count + replay->parameters.size());
    if (roots.empty() || targets.empty()) return grads;
    const torch::autograd::variable_list computed =
        torch::autograd::grad(roots, targets, root_grads, /*retain_graph=*/false, /*create_graph=*/false,
                              /*allow_unused=*/true);
    for (std::size_t k = 0; k < slots.size(); ++k) grads[1 + slots[k]] = computed[k];
    return grads;
  }
};

}  // namespace

forward_conditions::forward_conditions(const std::vector<at::Tensor>& inputs) {
  std::vector<at::Device> devices{at::kCPU};
  for (const at::Tensor& input : inputs) {
    if (std::find(devices.begin(), devices.end(), input.device()) == devices.end()) devices.push_back(input.device());
  }
  for (const at::Device& device : devices) {
    at::Generator generator = at::globalContext().defaultGenerator(device);
    const std::lock_guard<std::mutex> lock(generator.mutex());
    generators_.push_back({generator, generator.get_state()});
  }
  static_assert(autocast_devices.size() == std::tuple_size_v<decltype(autocast_)>);
  for (std::size_t d = 0; d < autocast_devices.size(); ++d) {
    if (at::autocast::is_autocast_enabled(autocast_devices[d])) {
      autocast_[d] = at::autocast::get_autocast_dtype(autocast_devices[d]);
    }
  }
}

void forward_conditions::replay(const std::function<void()>& body) const {
  const generators_replayed<generator_state> same_draws(generators_);
  std::array<std::optional<autocast_scope>, autocast_devices.size()> autocast;
  for (std::size_t d = 0; d < autocast_devices.size(); ++d) {
    if (autocast_[d]) autocast[d].emplace(autocast_devices[d], *autocast_[d]);
  }
  const at::AutoGradMode with_grad(true);
  body();
}

std::vector<at::Tensor> run_recomputed(const replay_forward& forward, const std::vector<at::Tensor>& inputs,
                                       const std::vector<at::Tensor>& parameters) {
  auto replay = c10::make_intrusive<replay_state>(forward, parameters, forward_conditions(inputs));
  return recomputation::apply(replay, at::TensorList(inputs), at::TensorList(parameters));
}

std::vector<std::string> recompute_units(torch::nn::Module& model, const recompute_options& options) {
  const std::vector<unit_module> units = find_units(model);
  if (units.empty()) {
    throw_error<std::invalid_argument>(
        "recompute(): the model has no loom::nn::Unit, so no block can be recomputed: hold each block as "
        "loom::nn::Unit<Block> and call it through that type (blocks[i]->as<loom::nn::Unit<Block>>()->forward(x)), "
        "or remove recompute(...)");
  }
  std::vector<std::string> chosen;
  for (std::size_t u = 0; u < units.size(); ++u) {
    const bool recomputes = options.recomputes(u);
    units[u].module->set_recompute(recomputes);
    if (recomputes) chosen.push_back(units[u].name);
  }
  if (chosen.empty()) {
    throw_error<std::invalid_argument>(
        "recompute({{.every = {}}}) chooses none of the model's {}: pass .every = {} or less", options.every,
        counted(static_cast<std::int64_t>(units.size()), "unit"), units.size());
  }
  return chosen;
}

}  // namespace loom::nn
