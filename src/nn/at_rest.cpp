#include <loom/nn/at_rest.hpp>

#include <loom/base/text.hpp>

namespace loom::nn {

void require_bytes(const at::Tensor& weight, std::string_view layer) {
  if (weight.numel() == 0 || !weight.has_storage() || weight.storage().nbytes() > 0) return;
  throw_error<parameters_at_rest>(
      "{}: its weight holds no bytes, because the strategy (fsdp()) shards it at rest and gathers it only around "
      "its unit's forward: call the model through job.forward(...), or call it yourself inside "
      "job.with_whole_module([&](auto& model) {{ ... }}), on every rank",
      layer);
}

}  // namespace loom::nn
