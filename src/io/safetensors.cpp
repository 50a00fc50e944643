#include <loom/io/safetensors.hpp>

#include "safetensors_reader.hpp"

#include <loom/base/text.hpp>
#include <loom/io/files.hpp>
#include <loom/runtime/failpoints.hpp>
#include <loom/runtime/host_reads.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

namespace loom {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors stores little-endian bytes");

using json = nlohmann::json;

// The header may be large (a name and a few numbers per tensor), but not unboundedly: the reference
// implementation caps it at 100 MB too.
constexpr std::uint64_t max_header_bytes = 100'000'000;

struct dtype_name {
  const char* name;
  c10::ScalarType type;
};

constexpr std::array<dtype_name, 15> dtypes{{
    {"BOOL", c10::ScalarType::Bool},
    {"U8", c10::ScalarType::Byte},
    {"I8", c10::ScalarType::Char},
    {"I16", c10::ScalarType::Short},
    {"U16", c10::ScalarType::UInt16},
    {"I32", c10::ScalarType::Int},
    {"U32", c10::ScalarType::UInt32},
    {"I64", c10::ScalarType::Long},
    {"U64", c10::ScalarType::UInt64},
    {"F16", c10::ScalarType::Half},
    {"BF16", c10::ScalarType::BFloat16},
    {"F32", c10::ScalarType::Float},
    {"F64", c10::ScalarType::Double},
    {"F8_E4M3", c10::ScalarType::Float8_e4m3fn},
    {"F8_E5M2", c10::ScalarType::Float8_e5m2},
}};

std::optional<c10::ScalarType> dtype_named(const std::string& name) {
  for (const dtype_name& d : dtypes) {
    if (name == d.name) return d.type;
  }
  return std::nullopt;
}

using entry = io_detail::safetensors_reader::entry;

[[noreturn]] void invalid(const std::filesystem::path& path, const std::string& problem) {
  throw_error<safetensors_error>("'{}' is not a valid safetensors file: {}", path.string(), problem);
}

entry parse_entry(const std::filesystem::path& path, const std::string& name, const json& value) {
  const auto bad = [&](const std::string& problem) { invalid(path, fmt::format("tensor '{}': {}", name, problem)); };
  if (!value.is_object()) bad("its entry is not an object");
  if (!value.contains("dtype") || !value["dtype"].is_string()) bad("it has no dtype");
  if (!value.contains("shape") || !value["shape"].is_array()) bad("it has no shape");
  if (!value.contains("data_offsets") || !value["data_offsets"].is_array() || value["data_offsets"].size() != 2) {
    bad("its data_offsets are not two numbers");
  }
  const std::string dtype_text = value["dtype"].get<std::string>();
  const std::optional<c10::ScalarType> dtype = dtype_named(dtype_text);
  if (!dtype) bad(fmt::format("its dtype '{}' is not one loom knows", dtype_text));
  entry e{{name, {}, *dtype}, 0, 0};
  // The bytes, and the product of the sizes with each 0 read as 1: a tensor's strides, which LibTorch
  // computes for an empty one too ([0, 2^62, 4]), must fit in an int64_t.
  std::uint64_t bytes = c10::elementSize(*dtype);
  std::uint64_t extent = bytes;
  for (const json& dim : value["shape"]) {
    if (!dim.is_number_unsigned()) bad("its shape holds something other than a non-negative integer");
    const auto size = dim.get<std::uint64_t>();
    if (__builtin_mul_overflow(bytes, size, &bytes) ||
        __builtin_mul_overflow(extent, std::max<std::uint64_t>(size, 1), &extent) ||
        extent > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      bad("its shape is too large");
    }
    e.spec.shape.push_back(static_cast<std::int64_t>(size));
  }
  for (std::size_t i = 0; i < 2; ++i) {
    if (!value["data_offsets"][i].is_number_unsigned()) bad("its data_offsets are not two non-negative integers");
  }
  e.begin = value["data_offsets"][0].get<std::uint64_t>();
  e.end = value["data_offsets"][1].get<std::uint64_t>();
  if (e.end < e.begin) bad(fmt::format("its data_offsets [{}, {}] end before they begin", e.begin, e.end));
  if (e.end - e.begin != bytes) {
    bad(fmt::format("its data_offsets [{}, {}] hold {} bytes, but {}{} needs {}", e.begin, e.end, e.end - e.begin,
                    dtype_text, value["shape"].dump(), bytes));
  }
  return e;
}

void parse_header(const std::filesystem::path& path, const std::string& text, std::vector<entry>& entries,
                  std::map<std::string, std::string>& metadata) {
  // nlohmann's parser keeps the last of two equal keys: a callback sees every key as it is read.
  std::set<std::string> names;
  std::optional<std::string> twice;
  const auto note_keys = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && !names.insert(parsed.get<std::string>()).second) {
      twice = twice.value_or(parsed.get<std::string>());
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text, note_keys);
  } catch (const json::exception& error) {
    invalid(path, fmt::format("its header is not JSON ({})", error.what()));
  }
  if (twice) invalid(path, fmt::format("its header names '{}' twice", *twice));
  if (!header.is_object()) invalid(path, "its header is not a JSON object");

  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) invalid(path, "its __metadata__ is not an object");
      for (const auto& [key, text_value] : value.items()) {
        if (!text_value.is_string()) invalid(path, fmt::format("its __metadata__ value for '{}' is not a string", key));
        metadata.emplace(key, text_value.get<std::string>());
      }
      continue;
    }
    entries.push_back(parse_entry(path, name, value));
  }
}

// The byte ranges, in file order, must tile the data section exactly: no gap, no overlap, nothing
// past its end.
void check_byte_ranges(const std::filesystem::path& path, std::vector<entry>& entries, std::uint64_t data_bytes) {
  std::sort(entries.begin(), entries.end(),
            [](const entry& a, const entry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  std::uint64_t expected = 0;
  for (const entry& e : entries) {
    if (e.begin < expected) {
      invalid(path, fmt::format("tensor '{}' (bytes [{}, {}]) overlaps the tensor before it, which ends at byte {}",
                                e.spec.name, e.begin, e.end, expected));
    }
    if (e.begin > expected) {
      invalid(path, fmt::format("{} bytes that no tensor holds lie before tensor '{}' (bytes [{}, {}])",
                                e.begin - expected, e.spec.name, e.begin, e.end));
    }
    if (e.end > data_bytes) {
      invalid(path, fmt::format("tensor '{}' ends at byte {}, past the end of the data ({} bytes)", e.spec.name, e.end,
                                data_bytes));
    }
    expected = e.end;
  }
  if (expected != data_bytes) {
    invalid(path,
            fmt::format("its tensors hold {} bytes, but {} bytes of data follow the header", expected, data_bytes));
  }
}

}  // namespace

namespace io_detail {

safetensors_reader::safetensors_reader(std::filesystem::path path)
    : path_(std::move(path)), in_(path_, std::ios::binary) {
  if (!in_) throw file_error_from_errno("open", path_);
  std::error_code size_error;
  const std::uint64_t file_size = std::filesystem::file_size(path_, size_error);
  if (size_error) invalid(path_, "its size cannot be read: " + size_error.message());
  if (file_size < 8)
    invalid(path_, fmt::format("it is {} bytes long, shorter than the 8-byte header length", file_size));
  std::array<unsigned char, 8> length_bytes{};
  in_.read(reinterpret_cast<char*>(length_bytes.data()), 8);
  std::uint64_t header_bytes = 0;
  for (std::size_t i = 8; i-- > 0;) header_bytes = (header_bytes << 8) | length_bytes[i];
  if (header_bytes > file_size - 8) {
    invalid(path_,
            fmt::format("its header length is {} bytes, but only {} bytes follow it", header_bytes, file_size - 8));
  }
  if (header_bytes > max_header_bytes)
    invalid(path_, fmt::format("its header length, {} bytes, exceeds 100 MB", header_bytes));
  std::string text(header_bytes, '\0');
  in_.read(text.data(), static_cast<std::streamsize>(header_bytes));
  if (!in_) invalid(path_, "its header cannot be read");
  checksum_.update(length_bytes.data(), length_bytes.size());
  checksum_.update(text.data(), text.size());
  parse_header(path_, text, entries_, metadata_);
  check_byte_ranges(path_, entries_, file_size - 8 - header_bytes);
  data_start_ = 8 + header_bytes;
  header_xxh3_ = checksum_.digest().xxh3;
}

std::uint64_t safetensors_reader::sampled_digest() {
  constexpr std::uint64_t sample_bytes = 16 << 10;
  xxh3_stream digest;
  digest.update(&header_xxh3_, sizeof header_xxh3_);
  std::vector<char> buffer;
  const auto take = [&](const entry& e, std::uint64_t begin, std::uint64_t bytes) {
    buffer.resize(bytes);
    in_.seekg(static_cast<std::streamoff>(data_start_ + begin));
    in_.read(buffer.data(), static_cast<std::streamsize>(bytes));
    if (!in_) invalid(path_, fmt::format("the bytes of '{}' cannot be read", e.spec.name));
    digest.update(buffer.data(), bytes);
  };
  for (const entry& e : entries_) {
    const std::uint64_t bytes = e.end - e.begin;
    if (bytes <= 3 * sample_bytes) {
      take(e, e.begin, bytes);
      continue;
    }
    take(e, e.begin, sample_bytes);
    take(e, e.begin + (bytes - sample_bytes) / 2, sample_bytes);
    take(e, e.end - sample_bytes, sample_bytes);
  }
  return digest.digest().xxh3;
}

at::Tensor safetensors_reader::read(const entry& e) {
  const std::int64_t rows = e.spec.shape.empty() ? 1 : e.spec.shape.front();
  at::Tensor tensor = read_rows(e, 0, rows);
  checksum_.update(tensor.const_data_ptr(), tensor.nbytes());
  return tensor;
}

at::Tensor safetensors_reader::read_rows(const entry& e, std::int64_t first, std::int64_t count) {
  const std::int64_t rows = e.spec.shape.empty() ? 1 : e.spec.shape.front();
  TORCH_INTERNAL_ASSERT(first >= 0 && count >= 0 && first + count <= rows, "rows [", first, ", ", first + count,
                        ") of '", e.spec.name, "', which has ", rows);
  std::vector<std::int64_t> shape = e.spec.shape;
  if (!shape.empty()) shape.front() = count;
  at::Tensor tensor = at::empty(shape, at::TensorOptions().dtype(e.spec.dtype));
  const std::uint64_t row_bytes = rows == 0 ? 0 : (e.end - e.begin) / static_cast<std::uint64_t>(rows);
  read_at(e, static_cast<std::uint64_t>(first) * row_bytes, tensor.data_ptr(), tensor.nbytes());
  return tensor;
}

at::Tensor safetensors_reader::read_slice_rows(const entry& e, const tensor_slice& slice, std::int64_t first,
                                               std::int64_t count) {
  const std::vector<std::int64_t>& whole = e.spec.shape;
  const auto dims = static_cast<std::int64_t>(whole.size());
  TORCH_INTERNAL_ASSERT(slice.dim >= 0 && slice.dim < dims && slice.first >= 0 && slice.count >= 0 &&
                            slice.first + slice.count <= whole[static_cast<std::size_t>(slice.dim)],
                        "a slice of '", e.spec.name, "' outside it");
  if (slice.dim == 0) {
    TORCH_INTERNAL_ASSERT(first >= 0 && count >= 0 && first + count <= slice.count, "rows [", first, ", ",
                          first + count, ") of a slice of '", e.spec.name, "', which has ", slice.count);
    return read_rows(e, slice.first + first, count);
  }
  TORCH_INTERNAL_ASSERT(first >= 0 && count >= 0 && first + count <= whole.front(), "rows [", first, ", ",
                        first + count, ") of '", e.spec.name, "', which has ", whole.front());
  std::vector<std::int64_t> shape = whole;
  shape.front() = count;
  shape[static_cast<std::size_t>(slice.dim)] = slice.count;
  at::Tensor tensor = at::empty(shape, at::TensorOptions().dtype(e.spec.dtype));
  // The slice is a run of contiguous bytes under each index of the dimensions before `dim`.
  const auto element = static_cast<std::uint64_t>(c10::elementSize(e.spec.dtype));
  std::int64_t inner = 1;
  for (std::int64_t d = slice.dim + 1; d < dims; ++d) inner *= whole[static_cast<std::size_t>(d)];
  std::int64_t between = 1;  // the indices of the dimensions between the rows and `dim`
  for (std::int64_t d = 1; d < slice.dim; ++d) between *= whole[static_cast<std::size_t>(d)];
  const std::int64_t across = whole[static_cast<std::size_t>(slice.dim)];
  const auto run_bytes = static_cast<std::uint64_t>(slice.count * inner) * element;
  auto* into = static_cast<char*>(tensor.data_ptr());
  for (std::int64_t run = 0; run < count * between; ++run) {
    const std::int64_t outer = (first + run / between) * between + run % between;
    const auto offset = static_cast<std::uint64_t>((outer * across + slice.first) * inner) * element;
    read_at(e, offset, into + static_cast<std::uint64_t>(run) * run_bytes, run_bytes);
  }
  return tensor;
}

void safetensors_reader::read_at(const entry& e, std::uint64_t offset, void* into, std::uint64_t bytes) {
  in_.seekg(static_cast<std::streamoff>(data_start_ + e.begin + offset));
  in_.read(static_cast<char*>(into), static_cast<std::streamsize>(bytes));
  if (!in_) invalid(path_, fmt::format("the bytes of '{}' cannot be read", e.spec.name));
  bytes_read_ += bytes;
}

}  // namespace io_detail

std::string safetensors_dtype(c10::ScalarType dtype) {
  for (const dtype_name& d : dtypes) {
    if (d.type == dtype) return d.name;
  }
  throw_error<safetensors_error>("safetensors has no dtype for {}", c10::toString(dtype));
}

file_digest save_safetensors(const std::filesystem::path& path, const std::vector<named_tensor>& tensors,
                             const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> contiguous;
  std::uint64_t offset = 0;
  for (const named_tensor& t : tensors) {
    if (header.contains(t.name)) {
      throw_error<safetensors_error>("cannot save '{}': the tensor name '{}' is given twice", path.string(), t.name);
    }
    at::Tensor bytes = read_on_host_uncounted(t.tensor).contiguous();
    const std::uint64_t size = bytes.nbytes();
    header[t.name] = {{"dtype", safetensors_dtype(bytes.scalar_type())},
                      {"shape", bytes.sizes().vec()},
                      {"data_offsets", {offset, offset + size}}};
    offset += size;
    contiguous.push_back(std::move(bytes));
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');  // the data starts 8-byte aligned, as the reference writes it
  std::array<unsigned char, 8> length{};
  for (std::size_t i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(text.size() >> (8 * i));

  atomic_file out(path);
  out.write(length.data(), length.size());
  out.write(text.data(), text.size());
  failpoint("safetensors.after-header");
  for (const at::Tensor& bytes : contiguous) out.write(bytes.const_data_ptr(), bytes.nbytes());
  out.commit();
  return out.digest();
}

safetensors_content load_safetensors(const std::filesystem::path& path) {
  io_detail::safetensors_reader reader(path);
  safetensors_content content{.tensors = {}, .metadata = reader.metadata(), .digest = {}};
  for (const auto& e : reader.entries()) content.tensors.push_back({e.spec.name, reader.read(e)});
  content.digest = reader.digest();
  return content;
}

}  // namespace loom
