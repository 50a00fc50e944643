#include <loom/nn/deferred_init.hpp>

#include <loom/base/text.hpp>
#include <loom/runtime/host_reads.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/GradMode.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <torch/nn/module.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

namespace loom::nn {
namespace {

// The scope in force on this thread: a thread's constructions are its own, as grad mode is.
thread_local deferred_init* active_scope = nullptr;

std::size_t page_size() { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }

std::size_t mapped_length(std::size_t bytes) {
  const std::size_t page = page_size();
  return (bytes + page - 1) / page * page;
}

struct mapping {
  void* address;
  std::size_t length;
};

void unmap(void* context) {
  auto* m = static_cast<mapping*>(context);
  munmap(m->address, m->length);
  delete m;
}

at::Tensor tensor_on(c10::Storage storage, at::IntArrayRef sizes, at::ScalarType type, c10::Device device) {
  at::Tensor tensor = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::computeDispatchKey(type, c10::kStrided, device)),
      c10::scalarTypeToTypeMeta(type));
  tensor.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return tensor;
}

// A tensor of `sizes` whose storage, resizable, holds no bytes yet.
at::Tensor without_bytes(at::IntArrayRef sizes, at::ScalarType type, c10::Device device) {
  auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), 0,
                                                       c10::DataPtr(nullptr, device), c10::GetAllocator(device.type()),
                                                       /*resizable=*/true);
  return tensor_on(c10::Storage(std::move(storage)), sizes, type, device);
}

// Address space the kernel backs with memory only where it is touched: a deferred parameter that
// something writes stays correct (and is found out by accept), one nothing touches costs nothing.
// None when the system refuses the reservation (strict overcommit): the layer then initialises at once.
std::optional<at::Tensor> reserved(at::IntArrayRef sizes, at::ScalarType type) {
  const std::int64_t numel = c10::multiply_integers(sizes);
  const std::size_t bytes = static_cast<std::size_t>(numel) * c10::elementSize(type);
  if (bytes == 0) return std::nullopt;
  const std::size_t length = mapped_length(bytes);
  void* address = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (address == MAP_FAILED) return std::nullopt;
  c10::DataPtr data(address, new mapping{address, length}, &unmap, c10::Device(c10::kCPU));
  auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), bytes, std::move(data),
                                                       c10::GetCPUAllocator(), /*resizable=*/false);
  return tensor_on(c10::Storage(std::move(storage)), sizes, type, c10::Device(c10::kCPU));
}

// Whether any page of a reserved tensor was read or written since it was mapped.
bool touched(const at::Tensor& tensor) {
  if (tensor.storage().nbytes() == 0) return false;
  const std::size_t length = mapped_length(tensor.storage().nbytes());
  std::vector<unsigned char> resident((length + page_size() - 1) / page_size());
  if (mincore(tensor.storage().mutable_data(), length, resident.data()) != 0) return true;
  return std::any_of(resident.begin(), resident.end(), [](unsigned char page) { return (page & 1) != 0; });
}

at::Tensor generator_state() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_generator_state(const at::Tensor& state) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

// Whether `tensor` holds more than one value: drawn, not filled with a constant as a norm's are.
bool varies(const at::Tensor& tensor) {
  return tensor.numel() > 1 &&
         !host_value<bool>(read_on_host_uncounted(tensor.detach().eq(tensor.detach().flatten()[0]).all()));
}

// "torch::nn::EmbeddingImpl (tok, pos), torch::nn::LinearImpl (blocks.0.attn.q_proj, ...)": the
// layers whose own parameters were constructed with bytes and drawn values.
std::string layers_holding_weights(const torch::nn::Module& root, const deferred_init& records) {
  std::map<std::string, std::vector<std::string>> by_type;
  for (const auto& item : root.named_modules("", /*include_self=*/true)) {
    for (const at::Tensor& parameter : item.value()->parameters(/*recurse=*/false)) {
      if (records.defers(parameter) || !varies(parameter)) continue;
      by_type[item.value()->name()].push_back(item.key().empty() ? "the model itself" : item.key());
      break;
    }
  }
  std::vector<std::string> parts;
  for (const auto& [type, names] : by_type) parts.push_back(fmt::format("{} ({})", type, some_of(names)));
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::string name_in(const torch::nn::Module& root, const at::Tensor& tensor) {
  for (const auto& item : root.named_parameters()) {
    if (item.value().is_same(tensor)) return item.key();
  }
  for (const auto& item : root.named_buffers()) {
    if (item.value().is_same(tensor)) return item.key();
  }
  return "a tensor it does not register";
}

}  // namespace

at::Tensor empty(at::IntArrayRef sizes, at::TensorOptions options) {
  deferred_init* records = active_scope;
  if (records == nullptr || options.device().type() != c10::kCPU) return at::empty(sizes, options);
  const at::ScalarType type = c10::typeMetaToScalarType(options.dtype());
  std::optional<at::Tensor> tensor = reserved(sizes, type);
  if (!tensor) return at::empty(sizes, options);
  records->records_.push_back({*tensor, sizes.vec(), type, std::nullopt});
  return *tensor;
}

void initialise(const at::Tensor& tensor, initializer init) {
  if (deferred_init* records = active_scope) {
    if (deferred_init::record* deferred = records->find(tensor)) {
      deferred->last_init = records->inits_.size();
      records->inits_.push_back({static_cast<std::size_t>(deferred - records->records_.data()), std::move(init)});
      return;
    }
  }
  c10::NoGradGuard no_grad;
  at::Tensor target = tensor;
  init.fill(target);
}

bool has_bytes(const at::Tensor& tensor) noexcept {
  return !tensor.defined() || !tensor.has_storage() || tensor.nbytes() == 0 || tensor.storage().nbytes() > 0;
}

void drop_bytes(const at::Tensor& tensor, at::ScalarType type, c10::Device device) {
  at::Tensor(tensor).set_data(without_bytes(tensor.sizes(), type, device));
}

void to_device(torch::nn::Module& module, c10::Device device) {
  c10::NoGradGuard no_grad;
  const auto move = [&](at::Tensor& tensor) {
    if (!tensor.defined() || tensor.device() == device) return;
    if (has_bytes(tensor)) {
      tensor.set_data(tensor.to(device));
    } else {
      drop_bytes(tensor, tensor.scalar_type(), device);
    }
  };
  for (at::Tensor& parameter : module.parameters()) move(parameter);
  for (at::Tensor& buffer : module.buffers()) move(buffer);
}

deferred_init::scope::scope(deferred_init& records) : records_(&records), outer_(active_scope) {
  records.own_start_state_ = generator_state();
  records.start_state_ = records.own_start_state_;
  active_scope = &records;
}

deferred_init::scope::~scope() {
  records_->end_state_ = generator_state();
  active_scope = outer_;
}

void deferred_init::rewind_generator() const { set_generator_state(own_start_state_); }

deferred_init::record* deferred_init::find(const at::Tensor& tensor) noexcept {
  const auto found =
      std::find_if(records_.begin(), records_.end(), [&](const record& r) { return r.tensor.is_same(tensor); });
  return found == records_.end() ? nullptr : &*found;
}

bool deferred_init::defers(const at::Tensor& tensor) const noexcept {
  return std::any_of(records_.begin(), records_.end(), [&](const record& r) { return r.tensor.is_same(tensor); });
}

std::optional<std::string> deferred_init::accept(const torch::nn::Module& root) {
  for (const record& r : records_) {
    if (touched(r.tensor)) {
      return fmt::format(
          "its constructor writes '{}' after the layer that made it deferred its initialisation; give it its "
          "values through loom::nn::initialise to construct only each rank's shards",
          name_in(root, r.tensor));
    }
  }
  if (!end_state_.equal(own_start_state_)) {
    const std::string layers = layers_holding_weights(root, *this);
    if (layers.empty()) {
      return std::string(
          "its constructor draws from the default generator outside loom's layers; draw through "
          "loom::nn::initialise to construct only each rank's shards");
    }
    return fmt::format(
        "{} initialise their own weights as they are constructed; build them from loom::nn::Linear and "
        "loom::nn::Embedding (or initialise through loom::nn::initialise) to construct only each rank's shards",
        layers);
  }
  for (const record& r : records_) drop_bytes(r.tensor, r.built_dtype, c10::Device(c10::kCPU));
  return std::nullopt;
}

at::Tensor deferred_init::add(at::IntArrayRef sizes, at::ScalarType type, initializer init) {
  if (init.draws) throw std::logic_error("loom: deferred_init::add takes an initializer that draws nothing");
  at::Tensor tensor = without_bytes(sizes, type, c10::Device(c10::kCPU));
  records_.push_back({tensor, sizes.vec(), type, inits_.size()});
  inits_.push_back({records_.size() - 1, std::move(init)});
  return tensor;
}

void deferred_init::materialise(const std::vector<row_request>& requests) {
  std::unordered_map<const c10::TensorImpl*, std::vector<const row_request*>> requested;
  for (const row_request& request : requests) {
    if (!defers(request.tensor)) {
      throw std::logic_error(
          fmt::format("loom: '{}' was requested from deferred_init, which has no record of it", request.name));
    }
    requested[request.tensor.unsafeGetTensorImpl()].push_back(&request);
  }
  // A tensor's value is its last initialisation's; an earlier one of it, or of a tensor no request
  // asks for, runs only for its draws, and only while a later one that is needed follows.
  const auto requested_for = [&](const record& r) { return requested.find(r.tensor.unsafeGetTensorImpl()); };
  std::size_t needed_through = 0;
  for (std::size_t e = 0; e < inits_.size(); ++e) {
    if (requested_for(records_[inits_[e].record]) != requested.end()) needed_through = e + 1;
  }
  const auto deliver = [&](const record& r, const at::Tensor& whole) {
    const std::int64_t rows = whole.dim() == 0 ? 1 : whole.size(0);
    const at::Tensor by_row = whole.to(r.tensor.scalar_type()).reshape({rows, rows == 0 ? 0 : whole.numel() / rows});
    for (const row_request* request : requested_for(r)->second) {
      at::Tensor(request->destination)
          .copy_(by_row.narrow(0, request->first_row, request->row_count).reshape(request->destination.sizes()));
      bytes_kept_ += request->destination.nbytes();
    }
    ++materialised_;
  };
  const at::Tensor saved = generator_state();
  set_generator_state(start_state_);
  c10::NoGradGuard no_grad;
  for (std::size_t e = 0; e < needed_through; ++e) {
    const record& r = records_[inits_[e].record];
    const bool delivers = r.last_init == e && requested_for(r) != requested.end();
    if (!delivers && !inits_[e].init.draws) continue;
    at::Tensor whole = at::empty(r.sizes, at::TensorOptions(r.built_dtype));
    inits_[e].init.fill(whole);
    if (delivers) deliver(r, whole);
  }
  for (const record& r : records_) {
    if (!r.last_init && requested_for(r) != requested.end())
      deliver(r, at::zeros(r.sizes, at::TensorOptions(r.built_dtype)));
  }
  set_generator_state(advances_generator_ && own_start_state_.equal(start_state_) ? generator_state() : saved);
}

}  // namespace loom::nn
