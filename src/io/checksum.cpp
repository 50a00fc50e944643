#include <loom/io/checksum.hpp>

#include <xxhash.h>

#include <new>

namespace loom {

struct xxh3_stream::state {
  XXH3_state_t* xxh = XXH3_createState();
  state() {
    if (xxh == nullptr) throw std::bad_alloc();
    XXH3_64bits_reset(xxh);
  }
  ~state() { XXH3_freeState(xxh); }
  state(const state&) = delete;
  state& operator=(const state&) = delete;
};

xxh3_stream::xxh3_stream() : state_(std::make_unique<state>()) {}
xxh3_stream::~xxh3_stream() = default;
xxh3_stream::xxh3_stream(xxh3_stream&&) noexcept = default;
xxh3_stream& xxh3_stream::operator=(xxh3_stream&&) noexcept = default;

void xxh3_stream::update(const void* data, std::size_t bytes) {
  XXH3_64bits_update(state_->xxh, data, bytes);
  bytes_ += bytes;
}

file_digest xxh3_stream::digest() const { return {bytes_, XXH3_64bits_digest(state_->xxh)}; }

std::uint64_t xxh3_of(const void* data, std::size_t bytes) { return XXH3_64bits(data, bytes); }

}  // namespace loom
