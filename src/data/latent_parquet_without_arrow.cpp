// loom::data::latent_parquet_dataset where loom was built without Apache Arrow (no pyarrow beside
// torch nor in .venv when Meson configured it, as on a machine with no package registry): the
// dataset refuses to be made, in one sentence; latent_parquet.cpp is the reader.
#include <loom/base/text.hpp>
#include <loom/data/latent_parquet.hpp>

#include <stdexcept>

namespace loom::data {

std::string_view name_of(latent_split split) noexcept { return split == latent_split::train ? "train" : "held_out"; }

struct latent_parquet_dataset::impl {};

latent_parquet_dataset::latent_parquet_dataset(latent_parquet_options) {
  throw_error<std::invalid_argument>(
      "latent_parquet_dataset: this loom was built without Apache Arrow's Parquet reader (pyarrow was not found "
      "when Meson configured it): run scripts/setup, which installs pyarrow into .venv, then configure the build "
      "again; or give the clips as loom's clip files (make_wan_latents.py)");
}

latent_parquet_dataset::latent_parquet_dataset(latent_parquet_dataset&&) noexcept = default;
latent_parquet_dataset& latent_parquet_dataset::operator=(latent_parquet_dataset&&) noexcept = default;
latent_parquet_dataset::~latent_parquet_dataset() = default;

// No dataset is ever made here, so none of these is reached.
latent_batch latent_parquet_dataset::next() { return {}; }
latent_batch latent_parquet_dataset::at(std::span<const std::int64_t>) const { return {}; }
std::string latent_parquet_dataset::state() const { return {}; }
void latent_parquet_dataset::restore(std::string_view) {}
const std::string& latent_parquet_dataset::identity() const noexcept {
  static const std::string none;
  return none;
}
std::int64_t latent_parquet_dataset::epoch() const noexcept { return 0; }
std::int64_t latent_parquet_dataset::rows() const noexcept { return 0; }
std::int64_t latent_parquet_dataset::rank_rows() const noexcept { return 0; }
std::int64_t latent_parquet_dataset::held_out_rows() const noexcept { return 0; }

}  // namespace loom::data
