#include <loom/replicas.hpp>

#include <loom/detail/consensus.hpp>
#include <loom/runtime.hpp>
#include <loom/schedule.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

namespace loom {
namespace {

struct named_tensor {
  std::string name;
  at::Tensor tensor;
};

std::vector<named_tensor> state_tensors(torch::nn::Module& module) {
  std::vector<named_tensor> tensors;
  for (const auto& item : module.named_parameters()) tensors.push_back({item.key(), item.value()});
  for (const auto& item : module.named_buffers()) tensors.push_back({item.key(), item.value()});
  return tensors;
}

std::string describe(const named_tensor& t) {
  return fmt::format("{} {}[{}]", t.name, c10::toString(t.tensor.scalar_type()), fmt::join(t.tensor.sizes(), ","));
}

std::uint64_t checksum(const named_tensor& t, bool with_values) {
  std::uint64_t hash = detail::fnv1a(describe(t));
  if (!with_values) return hash;
  at::Tensor bytes = t.tensor.detach().cpu().contiguous();
  return detail::fnv1a(bytes.data_ptr(), bytes.nbytes(), hash);
}

// Throws on every rank when some rank's list of tensors differs from rank 0's.
void agree(const runtime& rt, const std::vector<named_tensor>& tensors, bool with_values, const std::string& what) {
  std::vector<std::uint64_t> sums;
  sums.reserve(tensors.size());
  for (const auto& t : tensors) sums.push_back(checksum(t, with_values));
  auto where = detail::first_divergence(rt, sums);
  if (!where) return;
  const std::string mine = where->index < tensors.size() ? describe(tensors[where->index]) : "(none)";
  auto texts = detail::share_text(rt, "loom/replicas/" + std::to_string(where->index), mine);
  throw rank_mismatch(fmt::format(
      "loom: {}, but tensor #{} differs between rank 0 ('{}') and rank {} ('{}'){}", what, where->index, texts[0],
      where->rank, texts[static_cast<std::size_t>(where->rank)],
      texts[0] == texts[static_cast<std::size_t>(where->rank)]
          ? " in its values: the model's constructor draws from something other than the forked generator"
          : ": every rank must construct the same model from the same arguments"));
}

}  // namespace

forked_rng::forked_rng(std::uint64_t seed) : generator_(at::detail::getDefaultCPUGenerator()) {
  std::lock_guard<std::mutex> lock(generator_.mutex());
  saved_state_ = generator_.get_state();
  generator_.set_current_seed(seed);
}

forked_rng::~forked_rng() {
  std::lock_guard<std::mutex> lock(generator_.mutex());
  generator_.set_state(saved_state_);
}

void verify_identical_replicas(const runtime& rt, torch::nn::Module& module, std::uint64_t seed) {
  if (!rt.is_distributed()) return;
  agree(rt, state_tensors(module), /*with_values=*/true,
        fmt::format("seeded({}) should build bit-identical replicas on every rank", seed));
}

void broadcast_replicas(const runtime& rt, torch::nn::Module& module) {
  if (!rt.is_distributed()) return;
  auto tensors = state_tensors(module);
  agree(rt, tensors, /*with_values=*/false, "every rank must build the same model before rank 0's weights are broadcast");
  torch::NoGradGuard no_grad;
  std::vector<loom::pending_collective> pending;
  for (auto& t : tensors) pending.push_back(rt.comm().broadcast(t.tensor, 0));
  for (auto& p : pending) p.wait();
}

}  // namespace loom
