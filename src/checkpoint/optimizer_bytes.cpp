// The optimizer's state as the bytes of its archive: written, frozen for a background write, loaded.
#include "optimizer_bytes.hpp"

#include <loom/io/optimizer_state.hpp>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace loom::checkpoint_detail {

at::Tensor archive_bytes(torch::serialize::OutputArchive& archive) {
  auto bytes = std::make_shared<std::string>();
  archive.save_to([&bytes](const void* data, std::size_t size) {
    bytes->append(static_cast<const char*>(data), size);
    return size;
  });
  void* data = bytes->data();
  const auto size = static_cast<std::int64_t>(bytes->size());
  return at::from_blob(
      data, {size}, [owner = std::move(bytes)](void*) {}, at::TensorOptions().dtype(at::kByte));
}

at::Tensor optimizer_bytes(torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  return archive_bytes(archive);
}

std::optional<torch::serialize::OutputArchive> frozen_archive(torch::optim::Optimizer& optimizer,
                                                              host_staging& staging) {
  auto& states = optimizer.state();
  std::vector<std::pair<void*, std::unique_ptr<torch::optim::OptimizerParamState>>> swapped;
  for (const auto& [key, state] : states) {
    auto copy = copied_state(*state, [&staging](const at::Tensor& t) { return staging.stage(t); });
    if (!copy) return std::nullopt;
    swapped.emplace_back(key, std::move(copy));
  }
  const auto swap_all = [&] {
    for (auto& [key, state] : swapped) std::swap(states[key], state);
  };
  swap_all();
  torch::serialize::OutputArchive archive;
  try {
    optimizer.save(archive);
  } catch (...) {
    swap_all();
    throw;
  }
  swap_all();
  return archive;
}

void load_optimizer(torch::optim::Optimizer& optimizer, const at::Tensor& bytes) {
  torch::serialize::InputArchive archive;
  archive.load_from(static_cast<const char*>(bytes.const_data_ptr()), static_cast<std::size_t>(bytes.numel()));
  optimizer.load(archive);
}

}  // namespace loom::checkpoint_detail
