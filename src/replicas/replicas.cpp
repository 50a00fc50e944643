#include <loom/replicas/replicas.hpp>

#include <loom/base/text.hpp>
#include <loom/nn/deferred_init.hpp>
#include <loom/runtime/agreement.hpp>
#include <loom/runtime/host_reads.hpp>
#include <loom/runtime/runtime.hpp>
#include <loom/runtime/tensors.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

namespace loom {
namespace {

// A tensor constructed without its bytes (loom/nn/deferred_init.hpp) counts by its description: its
// values come from a record every rank replays alike.
std::uint64_t checksum(job_progress& progress, const named_tensor& t, bool with_values) {
  std::uint64_t hash = fnv1a(t.spec().to_string());
  if (!with_values || !nn::has_bytes(t.tensor)) return hash;
  const at::Tensor bytes = read_on_host(progress, t.tensor).contiguous();
  return fnv1a(bytes.data_ptr(), bytes.nbytes(), hash);
}

// Throws rank_mismatch on every rank when some rank's tensors differ from rank 0's.
void agree(const runtime& rt, const std::vector<named_tensor>& tensors, bool with_values, const std::string& what) {
  std::vector<std::uint64_t> sums;
  sums.reserve(tensors.size());
  for (const auto& t : tensors) sums.push_back(checksum(rt.progress(), t, with_values));
  require_agreement(
      rt, "replicas", sums, [&](std::size_t i) { return tensors[i].spec().to_string(); },
      [&](const disagreement& d) {
        return error_message(
            "{}, but tensor #{} differs between rank 0 ('{}') and rank {} ('{}'){}", what, d.index, d.rank0_item,
            d.rank, d.other_item,
            d.rank0_item == d.other_item
                ? " in its values: the model's constructor draws from something other than the forked generator"
                : ": every rank must construct the same model from the same arguments");
      });
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
  agree(rt, module_state(module), /*with_values=*/true,
        fmt::format("seeded({}) should build bit-identical replicas on every rank", seed));
}

void broadcast_replicas(const runtime& rt, torch::nn::Module& module, nn::deferred_init* deferred) {
  if (!rt.is_distributed()) return;
  auto tensors = module_state(module);
  agree(rt, tensors, /*with_values=*/false,
        "every rank must build the same model before rank 0's weights are broadcast");
  torch::NoGradGuard no_grad;
  std::vector<loom::pending_collective> pending;
  for (auto& t : tensors) {
    if (nn::has_bytes(t.tensor)) pending.push_back(rt.comm().broadcast(t.tensor, 0));
  }
  at::Tensor replay_state;
  if (deferred != nullptr && deferred->size() > 0) {
    // A generator's state: host bytes, sent between hosts.
    replay_state = deferred->start_state().clone();
    pending.push_back(rt.host_comm().broadcast(replay_state, 0));
  }
  for (auto& p : pending) p.wait();
  if (replay_state.defined()) deferred->replay_from(replay_state);
}

}  // namespace loom
