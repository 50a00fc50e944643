// A checkpoint's manifest (docs/checkpoints.md): its fields, listed once for its writer and its
// reader, its own checksum, and the reader that checks a step-N folder's manifest.json and the
// rank files it lists.
#include <loom/checkpoint/manifest.hpp>

#include "layout.hpp"
#include "manifest_detail.hpp"

#include <loom/base/text.hpp>
#include <loom/io/checksum.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <charconv>
#include <fstream>
#include <limits>
#include <optional>
#include <system_error>
#include <type_traits>

namespace loom {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using checkpoint_detail::damaged;
using checkpoint_detail::hex;
using checkpoint_detail::manifest_file;
using checkpoint_detail::rank_file;

// v2 records every file's checksum and the manifest's own; v1, sizes only, is still read.
constexpr const char* format_name = "loom checkpoint v2";
constexpr const char* unchecksummed_format_name = "loom checkpoint v1";
constexpr const char* manifest_checksum_key = "manifest_xxh3";

// A manifest's value, for a message: a number or a short string as written, anything else by its
// kind ("an object").
std::string described(const json& value) {
  if (value.is_number() || (value.is_string() && value.get_ref<const std::string&>().size() <= 40)) {
    return value.dump();
  }
  const std::string_view kind = value.type_name();
  return fmt::format("{} {}", kind.find_first_of("aeiou") == 0 ? "an" : "a", kind);
}

// A checksum as the manifest writes it: 16 hexadecimal digits.
std::optional<std::uint64_t> from_hex(const json& value) {
  if (!value.is_string()) return std::nullopt;
  const std::string& text = value.get_ref<const std::string&>();
  std::uint64_t parsed = 0;
  const char* end = text.data() + text.size();
  if (text.size() != 16 || std::from_chars(text.data(), end, parsed, 16).ptr != end) return std::nullopt;
  return parsed;
}

// The manifest's own checksum: XXH3-64 of the manifest without that field, as dump(2) writes it.
std::uint64_t manifest_checksum(const json& manifest_without_it) {
  const std::string text = manifest_without_it.dump(2);
  return xxh3_of(text.data(), text.size());
}

// The kinds of value a manifest's field holds, for the writer and the reader.
struct count_field {  // a whole number in [min, max], which JSON reads as unsigned
  std::uint64_t min;
  std::uint64_t max;
  const char* kind;
  bool optional = false;  // a manifest written before the field existed may lack it: then its default
};
struct flag_field {};
struct choice_field {  // true is `yes`, false is `no`
  const char* yes;
  const char* no;
};
struct text_field {
  bool optional = false;  // absent from manifests written before it
};
struct json_field {};          // JSON of the caller's, kept as its text
struct trained_over_field {};  // an object of trained_over's texts; absent from manifests written before it

// The manifest's fields, each once: its key, its member of checkpoint_manifest and its kind. The
// writer and the reader both walk this list ("format" and "files" are the file's own, not the
// struct's).
template <class Manifest, class Visit>
void for_each_manifest_field(Manifest& manifest, Visit&& visit) {
  visit("step", manifest.step,
        count_field{0, static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()), "a step number"});
  visit("world_size", manifest.world_size,
        count_field{1, static_cast<std::uint64_t>(std::numeric_limits<int>::max()), "a number of ranks"});
  visit("shard_group_size", manifest.shard_group_size,
        count_field{1, static_cast<std::uint64_t>(std::numeric_limits<int>::max()), "a number of ranks", true});
  visit("sharded", manifest.sharded, flag_field{});
  visit("tensor_parallel", manifest.tensor_parallel,
        count_field{1, static_cast<std::uint64_t>(std::numeric_limits<int>::max()), "a number of ranks", true});
  visit("parameters", manifest.all_parameters, choice_field{"all", "trainable"});
  visit("plan", manifest.plan, text_field{});
  visit("describe", manifest.describe, text_field{});
  visit("schedule_fingerprint", manifest.schedule_fingerprint, text_field{});
  visit("schedule", manifest.schedule, text_field{.optional = true});
  visit("libtorch", manifest.libtorch, text_field{});
  visit("loom", manifest.loom, text_field{});
  visit("user_state", manifest.user_state, json_field{});
  visit("trained_over", manifest.trained, trained_over_field{});
}

// The fields of a manifest's JSON, each checked against its kind.
checkpoint_manifest manifest_fields(const fs::path& path, const json& manifest) {
  const auto at = [&](const char* key) -> const json& {
    const auto found = manifest.find(key);
    if (found == manifest.end()) damaged(path, fmt::format("its manifest has no {}", key));
    return *found;
  };
  const auto wrong = [&](const char* key, const std::string& kind) {
    damaged(path, fmt::format("its manifest's {} is {}, not {}", key, described(at(key)), kind));
  };
  checkpoint_manifest read;
  for_each_manifest_field(read, [&](const char* key, auto& value, const auto& kind) {
    using kind_type = std::remove_cvref_t<decltype(kind)>;
    if constexpr (std::is_same_v<kind_type, count_field> || std::is_same_v<kind_type, text_field>) {
      if (kind.optional && !manifest.contains(key)) return;
    }
    if constexpr (std::is_same_v<kind_type, trained_over_field>) {
      if (!manifest.contains(key)) return;
    }
    const json& field = at(key);
    if constexpr (std::is_same_v<kind_type, count_field>) {
      if (!field.is_number_unsigned() || field.get<std::uint64_t>() < kind.min ||
          field.get<std::uint64_t>() > kind.max) {
        wrong(key, kind.kind);
      }
      value = static_cast<std::remove_cvref_t<decltype(value)>>(field.get<std::uint64_t>());
    } else if constexpr (std::is_same_v<kind_type, flag_field>) {
      if (!field.is_boolean()) wrong(key, "true or false");
      value = field.get<bool>();
    } else if constexpr (std::is_same_v<kind_type, choice_field>) {
      if (field != kind.yes && field != kind.no) wrong(key, fmt::format(R"("{}" or "{}")", kind.yes, kind.no));
      value = field == kind.yes;
    } else if constexpr (std::is_same_v<kind_type, text_field>) {
      if (!field.is_string()) wrong(key, "a string");
      value = field.get<std::string>();
    } else if constexpr (std::is_same_v<kind_type, trained_over_field>) {
      const auto text = [&](const char* part) {
        if (!field.is_object() || !field.contains(part) || !field[part].is_string()) {
          wrong(key, R"(an object of "pretrained", "pretrained_digest" and "data" texts)");
        }
        return field[part].get<std::string>();
      };
      value = trained_over{
          .pretrained = text("pretrained"), .pretrained_digest = text("pretrained_digest"), .data = text("data")};
    } else {
      value = field.dump();
    }
  });
  return read;
}

// One file a rank, each there and of the size the manifest's "files" records: in v2 an object of
// its bytes and checksum, in v1 its bytes alone.
std::map<std::string, file_digest> rank_files(const fs::path& path, const json& manifest, int world_size,
                                              bool checksummed) {
  const auto listed = manifest.find("files");
  if (listed == manifest.end()) damaged(path, "its manifest has no files");
  const json& files = *listed;
  if (!files.is_object()) damaged(path, fmt::format("its manifest's files is {}, not an object", described(files)));
  if (files.size() != static_cast<std::size_t>(world_size)) {
    damaged(path, fmt::format("its manifest lists {} for its world_size of {}",
                              counted(static_cast<std::int64_t>(files.size()), "file"), world_size));
  }
  std::map<std::string, file_digest> digests;
  for (int rank = 0; rank < world_size; ++rank) {
    const std::string file = rank_file(rank).string();
    const auto entry = files.find(file);
    if (entry == files.end()) damaged(path, fmt::format("its manifest lists no file '{}' for rank {}", file, rank));
    const json* size = &*entry;
    file_digest& digest = digests[file];
    if (checksummed) {
      const auto bytes = entry->is_object() ? entry->find("bytes") : entry->end();
      const auto xxh3 = entry->is_object() && entry->contains("xxh3") ? from_hex(entry->at("xxh3")) : std::nullopt;
      if (bytes == entry->end() || !xxh3) {
        damaged(path, fmt::format(R"(its manifest gives '{}' as {}, not {{"bytes": …, "xxh3": "<16 hex digits>"}})",
                                  file, described(*entry)));
      }
      digest.xxh3 = *xxh3;
      size = &*bytes;
    }
    if (!size->is_number_unsigned()) {
      damaged(path,
              fmt::format("its manifest gives the size of '{}' as {}, not a number of bytes", file, described(*size)));
    }
    digest.bytes = size->get<std::uint64_t>();
    std::error_code error;
    const auto actual = fs::file_size(path / file, error);
    if (error) damaged(path, fmt::format("its file '{}' is missing", file));
    if (actual != digest.bytes) {
      damaged(path, fmt::format("its file '{}' is {} bytes, the manifest says {}: truncated or overwritten", file,
                                actual, digest.bytes));
    }
  }
  return digests;
}

}  // namespace

namespace checkpoint_detail {

std::string hex(std::uint64_t value) { return fmt::format("{:016x}", value); }

json manifest_json(const checkpoint_manifest& manifest) {
  json out = {{"format", format_name}};
  for_each_manifest_field(manifest, [&](const char* key, const auto& value, const auto& kind) {
    using kind_type = std::remove_cvref_t<decltype(kind)>;
    if constexpr (std::is_same_v<kind_type, choice_field>) {
      out[key] = value ? kind.yes : kind.no;
    } else if constexpr (std::is_same_v<kind_type, json_field>) {
      out[key] = json::parse(value);
    } else if constexpr (std::is_same_v<kind_type, trained_over_field>) {
      if (value) {
        out[key] = {
            {"pretrained", value->pretrained}, {"pretrained_digest", value->pretrained_digest}, {"data", value->data}};
      }
    } else {
      out[key] = value;
    }
  });
  json files = json::object();
  for (const auto& [name, digest] : manifest.files) files[name] = {{"bytes", digest.bytes}, {"xxh3", hex(digest.xxh3)}};
  out["files"] = std::move(files);
  out[manifest_checksum_key] = hex(manifest_checksum(out));
  return out;
}

}  // namespace checkpoint_detail

checkpoint_manifest read_checkpoint_manifest(const fs::path& path) {
  json manifest;
  try {
    std::ifstream in(path / manifest_file);
    manifest = json::parse(in);
  } catch (const json::exception& error) {
    damaged(path, fmt::format("its {} is not JSON ({})", manifest_file, error.what()));
  }
  if (!manifest.is_object()) damaged(path, fmt::format("its {} is not a JSON object", manifest_file));
  const auto format = manifest.find("format");
  const bool checksummed = format != manifest.end() && *format == format_name;
  if (!checksummed && (format == manifest.end() || *format != unchecksummed_format_name)) {
    damaged(path, "its manifest is not a loom checkpoint's");
  }
  if (checksummed) {
    const auto recorded =
        manifest.contains(manifest_checksum_key) ? from_hex(manifest[manifest_checksum_key]) : std::nullopt;
    if (!recorded) damaged(path, fmt::format("its manifest has no {} of 16 hex digits", manifest_checksum_key));
    manifest.erase(manifest_checksum_key);
    if (const std::uint64_t actual = manifest_checksum(manifest); actual != *recorded) {
      damaged(path, fmt::format("its {} does not match its own checksum (written {}, read {}): it was damaged or "
                                "edited after the save",
                                manifest_file, hex(*recorded), hex(actual)));
    }
  }
  checkpoint_manifest read = manifest_fields(path, manifest);
  if (read.shard_group_size == 0) read.shard_group_size = read.world_size;
  if (read.world_size % read.tensor_parallel != 0 ||
      read.world_size / read.tensor_parallel % read.shard_group_size != 0) {
    damaged(path,
            fmt::format("its manifest's shard_group_size {} and tensor_parallel {} do not divide its world_size {}",
                        read.shard_group_size, read.tensor_parallel, read.world_size));
  }
  read.checksummed = checksummed;
  read.files = rank_files(path, manifest, read.world_size, checksummed);
  return read;
}

}  // namespace loom
