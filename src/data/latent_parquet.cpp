#include <loom/base/text.hpp>
#include <loom/data/latent_parquet.hpp>
#include <loom/io/checksum.hpp>

#include "data_files.hpp"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>
#include <parquet/metadata.h>
#include <parquet/schema.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <utility>

namespace loom::data {

std::string_view name_of(latent_split split) noexcept { return split == latent_split::train ? "train" : "held_out"; }

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// FastVideo writes ndarray.tobytes(): the host's order, little-endian on every machine it runs on.
static_assert(std::endian::native == std::endian::little, "latent_parquet_dataset reads little-endian float32 as is");

constexpr std::string_view who = "latent_parquet_dataset";
constexpr std::string_view rewrite =
    "write it again with FastVideo's preprocessing (or dsl_examples/data/make_fastvideo_parquet.py)";

// The columns of FastVideo's schema (fastvideo/dataset/dataloader/schema.py, pyarrow_schema_t2v) that
// a clip needs; the others (the caption, the source's size and frame rate, I2V's image features) stay
// unread.
enum column : std::size_t {
  id_column,
  latent_bytes,
  latent_shape,
  latent_dtype,
  text_bytes,
  text_shape,
  text_dtype,
  column_count
};
enum class column_kind { string, binary, int64_list };
constexpr std::array<std::string_view, column_count> column_names{"id",
                                                                  "vae_latent_bytes",
                                                                  "vae_latent_shape",
                                                                  "vae_latent_dtype",
                                                                  "text_embedding_bytes",
                                                                  "text_embedding_shape",
                                                                  "text_embedding_dtype"};
constexpr std::array<column_kind, column_count> column_kinds{
    column_kind::string, column_kind::binary,     column_kind::int64_list, column_kind::string,
    column_kind::binary, column_kind::int64_list, column_kind::string};

std::string_view kind_name(column_kind kind) {
  switch (kind) {
    case column_kind::string: return "string";
    case column_kind::binary: return "binary";
    case column_kind::int64_list: return "list<int64>";
  }
  return "";
}

bool is_kind(const arrow::DataType& type, column_kind kind) {
  switch (kind) {
    case column_kind::string: return type.id() == arrow::Type::STRING || type.id() == arrow::Type::LARGE_STRING;
    case column_kind::binary: return type.id() == arrow::Type::BINARY || type.id() == arrow::Type::LARGE_BINARY;
    case column_kind::int64_list:
      return (type.id() == arrow::Type::LIST || type.id() == arrow::Type::LARGE_LIST) &&
             static_cast<const arrow::BaseListType&>(type).value_type()->id() == arrow::Type::INT64;
  }
  return false;
}

struct parquet_file {
  fs::path path;
  std::string name;  // its path under the folder given: what identity() and a state name it by
  std::uintmax_t size = 0;
  std::uint64_t footer_xxh3 = 0;
  std::vector<int> leaves;  // the Parquet leaf columns that hold FastVideo's columns
};

struct row_group {
  std::uint32_t file;
  int index;  // in its file
  std::int64_t rows;
  std::int64_t first;  // the dataset's index of its first row
};

// The files, their row groups and the split's rows: fixed once the dataset is built, and read by the
// caller's thread and the read-ahead thread alike.
struct catalog {
  std::vector<parquet_file> files;
  std::vector<row_group> groups;
  std::int64_t all_rows = 0;
  std::int64_t held_out = 0;
  std::int64_t begin = 0, end = 0;  // the split's rows
};

// The *.parquet files under `paths`, each folder's in the order of their full paths (as FastVideo's
// os.walk and sort list them), named by their path under it.
std::vector<parquet_file> listed_files(const std::vector<fs::path>& paths) {
  if (paths.empty()) throw_error<std::invalid_argument>("{}: no paths given: name files or folders of data", who);
  std::vector<parquet_file> files;
  for (const fs::path& path : paths) {
    std::error_code error;
    if (fs::is_directory(path, error)) {
      std::vector<fs::path> found;
      for (const auto& entry : fs::recursive_directory_iterator(path))
        if (entry.is_regular_file() && entry.path().extension() == ".parquet") found.push_back(entry.path());
      std::ranges::sort(found, {}, [](const fs::path& p) { return p.string(); });
      if (found.empty()) {
        throw_error<std::invalid_argument>(
            "{}: the folder {} has no .parquet files, in it or under it: give the output folder of FastVideo's "
            "preprocessing (its combined_parquet_dataset)",
            who, path.string());
      }
      for (const fs::path& file : found)
        files.push_back({file, fs::relative(file, path).generic_string(), fs::file_size(file), 0, {}});
    } else if (fs::is_regular_file(path, error)) {
      files.push_back({path, path.filename().string(), fs::file_size(path), 0, {}});
    } else {
      throw_error<std::invalid_argument>("{}: {} is neither a file nor a folder: there is no such path", who,
                                         path.string());
    }
  }
  return files;
}

// The XXH3-64 of the file's footer: a Parquet file ends in its footer, the footer's length (4 bytes,
// little-endian) and "PAR1".
std::uint64_t footer_digest(const parquet_file& file) {
  const auto refuse = [&](std::string_view why) {
    throw_error<std::invalid_argument>(
        "{}: {} is not a whole Parquet file ({}): it is truncated or of another "
        "format; {}",
        who, file.path.string(), why, rewrite);
  };
  if (file.size < 12) refuse(fmt::format("it has {} bytes", file.size));
  std::ifstream in(file.path, std::ios::binary);
  std::array<char, 8> tail{};
  in.seekg(static_cast<std::streamoff>(file.size - tail.size()));
  in.read(tail.data(), tail.size());
  if (!in || std::string_view(tail.data() + 4, 4) != "PAR1") refuse("it does not end in PAR1");
  std::uint32_t length = 0;
  std::memcpy(&length, tail.data(), sizeof length);
  if (length + 12ULL > file.size)
    refuse(fmt::format("its footer is said to have {} bytes, more than the file", length));
  std::vector<char> footer(length);
  in.seekg(static_cast<std::streamoff>(file.size - tail.size() - length));
  in.read(footer.data(), static_cast<std::streamsize>(length));
  if (!in) refuse("its footer cannot be read");
  xxh3_stream digest;
  digest.update(footer.data(), footer.size());
  return digest.digest().xxh3;
}

std::unique_ptr<parquet::arrow::FileReader> open_reader(const parquet_file& file) {
  const auto refuse = [&](std::string_view why) {
    throw_error<std::invalid_argument>("{}: {} cannot be read as Parquet ({}): {}", who, file.path.string(), why,
                                       rewrite);
  };
  try {
    auto opened = arrow::io::ReadableFile::Open(file.path.string());
    if (!opened.ok()) {
      throw_error<std::runtime_error>(
          "{}: {} cannot be opened ({}), though it was listed: restore it, or start the run again on the data as "
          "it is now",
          who, file.path.string(), opened.status().ToString());
    }
    auto reader = parquet::arrow::OpenFile(*opened, arrow::default_memory_pool());
    if (!reader.ok()) refuse(reader.status().ToString());
    return std::move(*reader);
  } catch (const parquet::ParquetException& error) {
    refuse(error.what());
  }
  return nullptr;
}

// Checks the file's schema against FastVideo's, and notes its row groups and the leaf columns to read.
void index_file(catalog& data, std::uint32_t index) {
  parquet_file& file = data.files[index];
  file.footer_xxh3 = footer_digest(file);
  const std::unique_ptr<parquet::arrow::FileReader> reader = open_reader(file);
  std::shared_ptr<arrow::Schema> schema;
  if (const arrow::Status status = reader->GetSchema(&schema); !status.ok()) {
    throw_error<std::invalid_argument>("{}: {}'s schema cannot be read as Arrow's ({}): {}", who, file.path.string(),
                                       status.ToString(), rewrite);
  }
  for (std::size_t c = 0; c < column_count; ++c) {
    const std::shared_ptr<arrow::Field> field = schema->GetFieldByName(std::string(column_names[c]));
    if (!field) {
      throw_error<std::invalid_argument>(
          "{}: {} is not one of FastVideo's datasets: it has no column \"{}\" (it has {}); {}", who, file.path.string(),
          column_names[c], some_of(schema->field_names()), rewrite);
    }
    if (!is_kind(*field->type(), column_kinds[c])) {
      throw_error<std::invalid_argument>("{}: {}'s column \"{}\" is {}, and FastVideo's schema has {} there; {}", who,
                                         file.path.string(), column_names[c], field->type()->ToString(),
                                         kind_name(column_kinds[c]), rewrite);
    }
  }
  const std::shared_ptr<parquet::FileMetaData> metadata = reader->parquet_reader()->metadata();
  const parquet::SchemaDescriptor& leaves = *metadata->schema();
  for (int leaf = 0; leaf < leaves.num_columns(); ++leaf) {
    const std::string top = leaves.Column(leaf)->path()->ToDotVector().front();
    if (std::ranges::find(column_names, top) != column_names.end()) file.leaves.push_back(leaf);
  }
  for (int g = 0; g < metadata->num_row_groups(); ++g) {
    const std::int64_t rows = metadata->RowGroup(g)->num_rows();
    if (rows == 0) continue;
    data.groups.push_back({index, g, rows, data.all_rows});
    data.all_rows += rows;
  }
}

// A clip as its row holds it: the latents [C, F, H, W] and the text states [L, D], unpadded.
struct decoded_row {
  std::int64_t row = 0;  // from the split's first
  std::string id;
  std::string place;  // "FILE, row group G, row R (id 'ID')", for what is refused about it
  std::array<std::int64_t, 4> latent_shape{};
  std::vector<float> latents;
  std::int64_t tokens = 0, width = 0;
  std::vector<float> text;
};

// The chunk that holds `row` of a column, and the row's index in it.
std::pair<const arrow::Array*, std::int64_t> element(const arrow::ChunkedArray& column, std::int64_t row) {
  for (const std::shared_ptr<arrow::Array>& chunk : column.chunks()) {
    if (row < chunk->length()) return {chunk.get(), row};
    row -= chunk->length();
  }
  throw_error<std::logic_error>("{}: row {} is past a column of {} rows", who, row, column.length());
}

std::optional<std::string_view> bytes_at(const arrow::ChunkedArray& column, std::int64_t row) {
  const auto [array, i] = element(column, row);
  if (array->IsNull(i)) return std::nullopt;
  const arrow::Type::type type = array->type_id();
  if (type == arrow::Type::LARGE_BINARY || type == arrow::Type::LARGE_STRING)
    return static_cast<const arrow::LargeBinaryArray&>(*array).GetView(i);
  return static_cast<const arrow::BinaryArray&>(*array).GetView(i);
}

template <class ListArray>
std::optional<std::vector<std::int64_t>> list_at(const ListArray& list, std::int64_t i) {
  const auto& values = static_cast<const arrow::Int64Array&>(*list.values());
  std::vector<std::int64_t> shape;
  for (auto k = list.value_offset(i); k < list.value_offset(i) + list.value_length(i); ++k) {
    if (values.IsNull(k)) return std::nullopt;
    shape.push_back(values.Value(k));
  }
  return shape;
}

std::optional<std::vector<std::int64_t>> shape_at(const arrow::ChunkedArray& column, std::int64_t row) {
  const auto [array, i] = element(column, row);
  if (array->IsNull(i)) return std::nullopt;
  if (array->type_id() == arrow::Type::LARGE_LIST) return list_at(static_cast<const arrow::LargeListArray&>(*array), i);
  return list_at(static_cast<const arrow::ListArray&>(*array), i);
}

// Reads row groups of the catalog's files, the last file kept open; one a thread.
class group_reader {
 public:
  explicit group_reader(const catalog& data) : data_(data) {}

  // The rows `rows` (in the group) of row group `g` (the catalog's), decoded and checked, in that order.
  std::vector<decoded_row> read(std::size_t g, std::span<const std::int64_t> rows) {
    const row_group& group = data_.groups[g];
    const parquet_file& file = data_.files[group.file];
    still_there(file);
    if (open_ != group.file) {
      reader_ = open_reader(file);
      open_ = group.file;
    }
    arrow::Result<std::shared_ptr<arrow::Table>> table;
    try {
      table = reader_->ReadRowGroup(group.index, file.leaves);
    } catch (const parquet::ParquetException& error) {
      table = arrow::Status::IOError(error.what());
    }
    if (!table.ok()) {
      throw_error<std::invalid_argument>("{}: {}, row group {} cannot be read ({}): the file is damaged; {}", who,
                                         file.path.string(), group.index, table.status().ToString(), rewrite);
    }
    std::array<std::shared_ptr<arrow::ChunkedArray>, column_count> columns;
    for (std::size_t c = 0; c < column_count; ++c) columns[c] = (*table)->GetColumnByName(std::string(column_names[c]));
    std::vector<decoded_row> decoded;
    decoded.reserve(rows.size());
    for (const std::int64_t r : rows) decoded.push_back(decode(columns, file, group, r));
    return decoded;
  }

 private:
  // The file as large as it was listed: a file replaced while the run reads it is refused, not read.
  static void still_there(const parquet_file& file) {
    std::error_code error;
    const std::uintmax_t size = fs::file_size(file.path, error);
    if (error || size != file.size) {
      throw_error<std::runtime_error>(
          "{}: {} {} since the dataset was listed ({} bytes then): restore it, or start the run again on the data as "
          "it is now",
          who, file.path.string(), error ? "is gone" : fmt::format("has changed to {} bytes", size), file.size);
    }
  }

  decoded_row decode(const std::array<std::shared_ptr<arrow::ChunkedArray>, column_count>& columns,
                     const parquet_file& file, const row_group& group, std::int64_t r) const {
    decoded_row row;
    row.row = group.first + r - data_.begin;
    row.id = std::string(bytes_at(*columns[id_column], r).value_or(""));
    row.place = fmt::format("{}, row group {}, row {} (id '{}')", file.path.string(), group.index, r, row.id);
    const auto refuse = [&](const std::string& what) {
      throw_error<std::invalid_argument>("{}: {}: {}: the row is damaged; {}", who, row.place, what, rewrite);
    };
    // The float32 values of one tensor, checked against its shape and dtype.
    const auto tensor = [&](column bytes, column shape_column, column dtype, std::size_t dims,
                            std::string_view layout) {
      const std::string_view name = column_names[shape_column];
      const std::optional<std::vector<std::int64_t>> shape = shape_at(*columns[shape_column], r);
      if (!shape) refuse(fmt::format("{} is null", name));
      if (shape->size() != dims)
        refuse(fmt::format("{} is [{}], not the {} dimensions {}", name, fmt::join(*shape, ", "), dims, layout));
      // The values the shape counts; a count past what any file could hold stays above every size.
      constexpr std::uint64_t beyond = std::numeric_limits<std::uint64_t>::max() / sizeof(float);
      std::uint64_t count = 1;
      for (const std::int64_t d : *shape) {
        if (d < 0 || (d == 0 && bytes != text_bytes)) refuse(fmt::format("{} is [{}]", name, fmt::join(*shape, ", ")));
        count =
            d != 0 && count > beyond / static_cast<std::uint64_t>(d) ? beyond : count * static_cast<std::uint64_t>(d);
      }
      const std::optional<std::string_view> type = bytes_at(*columns[dtype], r);
      if (type != "float32") {
        refuse(fmt::format("{} is '{}': only float32 is read, as FastVideo's preprocessing writes it",
                           column_names[dtype], type.value_or("null")));
      }
      const std::optional<std::string_view> raw = bytes_at(*columns[bytes], r);
      if (!raw) refuse(fmt::format("{} is null", column_names[bytes]));
      if (raw->size() != count * sizeof(float)) {
        refuse(fmt::format("{} has {} bytes, and {} [{}] in float32 needs {}", column_names[bytes], raw->size(), name,
                           fmt::join(*shape, ", "), count * sizeof(float)));
      }
      std::vector<float> values(count);
      std::memcpy(values.data(), raw->data(), raw->size());
      return std::pair{*shape, std::move(values)};
    };
    auto [latent_dims, latents] = tensor(latent_bytes, latent_shape, latent_dtype, 4, "[C, F, H, W]");
    std::ranges::copy(latent_dims, row.latent_shape.begin());
    row.latents = std::move(latents);
    auto [text_dims, text] = tensor(text_bytes, text_shape, text_dtype, 2, "[L, D]");
    if (text_dims[1] == 0) refuse("text_embedding_shape is [L, 0]");
    row.tokens = text_dims[0];
    row.width = text_dims[1];
    row.text = std::move(text);
    return row;
  }

  const catalog& data_;
  std::uint32_t open_ = std::numeric_limits<std::uint32_t>::max();
  std::unique_ptr<parquet::arrow::FileReader> reader_;
};

// One batch of `rows`, the text padded or cut to text_len; rows unlike the first are refused.
latent_batch stacked(std::vector<decoded_row>& rows, std::int64_t text_len) {
  const decoded_row& first = rows.front();
  const auto count = static_cast<std::int64_t>(rows.size());
  latent_batch batch;
  batch.latents_shape = {count, first.latent_shape[0], first.latent_shape[1], first.latent_shape[2],
                         first.latent_shape[3]};
  batch.text_shape = {count, text_len, first.width};
  batch.latents.reserve(rows.size() * first.latents.size());
  batch.text.assign(static_cast<std::size_t>(count * text_len * first.width), 0.0F);
  batch.text_mask.assign(static_cast<std::size_t>(count * text_len), 0);
  for (std::size_t b = 0; b < rows.size(); ++b) {
    decoded_row& row = rows[b];
    if (row.latent_shape != first.latent_shape || row.width != first.width) {
      throw_error<std::invalid_argument>(
          "{}: {} has latents [{}] and text states of width {}, unlike {} ([{}], width {}) in the same batch: give "
          "clips of one shape (FastVideo's preprocessing makes them so for one resolution and frame count)",
          who, row.place, fmt::join(row.latent_shape, ", "), row.width, first.place,
          fmt::join(first.latent_shape, ", "), first.width);
    }
    batch.latents.insert(batch.latents.end(), row.latents.begin(), row.latents.end());
    const std::int64_t kept = std::min(row.tokens, text_len);
    std::ranges::copy_n(row.text.begin(), kept * row.width,
                        batch.text.begin() + static_cast<std::ptrdiff_t>(b) * text_len * row.width);
    std::fill_n(batch.text_mask.begin() + static_cast<std::ptrdiff_t>(b) * text_len, kept, std::uint8_t{1});
    batch.rows.push_back(row.row);
    batch.ids.push_back(std::move(row.id));
  }
  return batch;
}

// A 64-bit mix (splitmix64's finalizer), for each row group's own shuffle seed.
std::uint64_t mixed(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// The rows of one row group that a rank reads in a row, in their order.
struct segment {
  std::size_t group;
  std::vector<std::int64_t> rows;  // in the group
};

// A rank's reading of one epoch: its segments and where each starts in its share.
struct epoch_plan {
  std::int64_t epoch = -1;
  std::vector<segment> segments;
  std::vector<std::int64_t> starts;

  // The segment that holds the share's row k, and k's place in it.
  [[nodiscard]] std::pair<std::size_t, std::size_t> locate(std::int64_t k) const {
    const auto s = static_cast<std::size_t>(std::ranges::upper_bound(starts, k) - starts.begin()) - 1;
    return {s, static_cast<std::size_t>(k - starts[s])};
  }
};

// A row group read ahead: segment `segment` of `epoch`'s plan, or the error reading it met.
struct loaded_segment {
  std::int64_t epoch = 0;
  std::size_t segment = 0;
  std::vector<decoded_row> rows;
  std::exception_ptr error;
};

}  // namespace

struct latent_parquet_dataset::impl {
  latent_parquet_options options;
  catalog data;
  // The split's parts of the row groups: the group, its first row in the split and how many.
  struct piece {
    std::size_t group;
    std::int64_t from, rows;
  };
  std::vector<piece> pieces;
  std::int64_t lo = 0, hi = 0;  // this rank's share of an epoch's order
  json fingerprint;
  std::string identity;

  // The position: the epoch, and the rows of this rank's share read in it.
  std::int64_t epoch = 0;
  std::int64_t read = 0;
  epoch_plan plan;  // the caller's, of `epoch`

  // Reading ahead: segments in the order the position meets them, the first the one being read.
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<loaded_segment> ready;
  bool stopping = false;
  std::thread reader;
  std::optional<group_reader> own;  // read_ahead = 0: the caller reads
  loaded_segment current;           // read_ahead = 0: the segment being read

  impl() = default;
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;
  ~impl() { stop(); }

  [[nodiscard]] std::int64_t rank_rows() const noexcept { return hi - lo; }

  // The order of an epoch: the split's pieces shuffled by (seed, epoch), each one's rows by (seed, its
  // group, epoch); this rank's run of it, [lo, hi), cut into segments.
  [[nodiscard]] epoch_plan plan_of(std::int64_t e) const {
    epoch_plan made;
    made.epoch = e;
    const std::vector<std::uint64_t> order =
        options.shuffle ? detail::shuffled_order(pieces.size(), options.seed, e) : std::vector<std::uint64_t>{};
    std::int64_t position = 0;
    for (std::size_t p = 0; p < pieces.size() && position < hi; ++p) {
      const piece& part = pieces[options.shuffle ? order[p] : p];
      const std::int64_t first = std::max(lo - position, std::int64_t{0});
      const std::int64_t last = std::min(hi - position, part.rows);
      position += part.rows;
      if (first >= last) continue;
      const std::vector<std::uint64_t> inner = options.shuffle
                                                   ? detail::shuffled_order(static_cast<std::uint64_t>(part.rows),
                                                                            mixed(options.seed ^ mixed(part.group)), e)
                                                   : std::vector<std::uint64_t>{};
      segment taken{part.group, {}};
      for (std::int64_t j = first; j < last; ++j)
        taken.rows.push_back(part.from + (options.shuffle ? static_cast<std::int64_t>(inner[j]) : j));
      made.starts.push_back(
          made.segments.empty() ? 0 : made.starts.back() + static_cast<std::int64_t>(made.segments.back().rows.size()));
      made.segments.push_back(std::move(taken));
    }
    return made;
  }

  void start() {
    if (options.read_ahead == 0) return;
    stopping = false;
    reader = std::thread([this, e = epoch, k = read] { read_ahead(e, k); });
  }

  void stop() {
    {
      const std::lock_guard lock(mutex);
      stopping = true;
    }
    changed.notify_all();
    if (reader.joinable()) reader.join();
    ready.clear();
    current = {};
  }

  // The reader: the segments from the position (e, k) on, `read_ahead` beyond the one being read; an
  // error is queued in its segment's place and ends the reading.
  void read_ahead(std::int64_t e, std::int64_t k) {
    group_reader files(data);
    epoch_plan ahead = plan_of(e);
    std::size_t s = ahead.locate(k).first;
    for (;;) {
      {
        std::unique_lock lock(mutex);
        changed.wait(lock, [&] { return stopping || ready.size() <= static_cast<std::size_t>(options.read_ahead); });
        if (stopping) return;
      }
      loaded_segment loaded{ahead.epoch, s, {}, nullptr};
      try {
        loaded.rows = files.read(ahead.segments[s].group, ahead.segments[s].rows);
      } catch (...) {
        loaded.error = std::current_exception();
      }
      const bool failed = loaded.error != nullptr;
      {
        const std::lock_guard lock(mutex);
        ready.push_back(std::move(loaded));
      }
      changed.notify_all();
      if (failed) return;
      if (++s == ahead.segments.size()) {
        ahead = plan_of(ahead.epoch + 1);
        s = 0;
      }
    }
  }

  // The segment `s` of the position's epoch, read: the read-ahead queue's first, or read here.
  loaded_segment& segment_of(std::size_t s) {
    if (options.read_ahead == 0) {
      if (current.rows.empty() || current.epoch != epoch || current.segment != s) {
        if (!own) own.emplace(data);
        current = {epoch, s, own->read(plan.segments[s].group, plan.segments[s].rows), nullptr};
      }
      return current;
    }
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return !ready.empty(); });
    loaded_segment& front = ready.front();
    if (front.error) std::rethrow_exception(front.error);  // kept: every later call says it again
    if (front.epoch != epoch || front.segment != s)
      throw_error<std::logic_error>("{}: read ahead epoch {} part {}, and the position is at epoch {} part {}", who,
                                    front.epoch, front.segment, epoch, s);
    return front;
  }

  decoded_row next_row() {
    if (plan.epoch != epoch) plan = plan_of(epoch);
    const auto [s, offset] = plan.locate(read);
    loaded_segment& loaded = segment_of(s);
    decoded_row row = std::move(loaded.rows[offset]);
    if (offset + 1 == loaded.rows.size()) {
      if (options.read_ahead == 0) {
        current = {};
      } else {
        {
          const std::lock_guard lock(mutex);
          ready.pop_front();
        }
        changed.notify_all();
      }
    }
    if (++read == rank_rows()) {
      ++epoch;
      read = 0;
    }
    return row;
  }
};

latent_parquet_dataset::latent_parquet_dataset(latent_parquet_options options) : core_(std::make_unique<impl>()) {
  impl& c = *core_;
  if (options.batch_size < 1)
    throw_error<std::invalid_argument>("{}: batch_size is {}; give at least 1", who, options.batch_size);
  if (options.text_len < 1)
    throw_error<std::invalid_argument>("{}: text_len is {}; give at least 1", who, options.text_len);
  if (!(options.held_out_fraction >= 0.0 && options.held_out_fraction < 1.0)) {
    throw_error<std::invalid_argument>("{}: held_out_fraction is {}; give a share from 0 up to (not including) 1", who,
                                       options.held_out_fraction);
  }
  if (options.read_ahead < 0)
    throw_error<std::invalid_argument>("{}: read_ahead is {}; give 0 or more row groups", who, options.read_ahead);
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    throw_error<std::invalid_argument>("{}: rank {} of {} data-parallel ranks: give 0 <= rank < world_size", who,
                                       options.rank, options.world_size);
  }
  catalog& data = c.data;
  data.files = listed_files(options.paths);
  for (std::uint32_t f = 0; f < data.files.size(); ++f) index_file(data, f);
  std::vector<std::string> names;
  for (const parquet_file& f : data.files) names.push_back(f.name);
  if (data.all_rows == 0)
    throw_error<std::invalid_argument>("{}: no rows in {}: every file is empty", who, some_of(names));
  if (options.held_out_fraction > 0.0) {
    data.held_out = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(options.held_out_fraction * static_cast<double>(data.all_rows)));
  }
  if (data.held_out >= data.all_rows) {
    throw_error<std::invalid_argument>("{}: held_out_fraction {} holds out all {}: give a smaller share, or more data",
                                       who, options.held_out_fraction, counted(data.all_rows, "row"));
  }
  data.begin = options.split == latent_split::train ? 0 : data.all_rows - data.held_out;
  data.end = options.split == latent_split::train ? data.all_rows - data.held_out : data.all_rows;
  const std::int64_t n = data.end - data.begin;
  if (n < options.world_size) {
    throw_error<std::invalid_argument>(
        "{}: the {} split has {} for {} data-parallel ranks: each rank needs one at least", who, name_of(options.split),
        counted(n, "row"), options.world_size);
  }
  for (std::size_t g = 0; g < data.groups.size(); ++g) {
    const row_group& group = data.groups[g];
    const std::int64_t from = std::max(data.begin, group.first), to = std::min(data.end, group.first + group.rows);
    if (from < to) c.pieces.push_back({g, from - group.first, to - from});
  }
  c.lo = n * options.rank / options.world_size;
  c.hi = n * (options.rank + 1) / options.world_size;

  json listed = json::array();
  std::uintmax_t bytes = 0;
  xxh3_stream digest;
  for (const parquet_file& f : data.files) {
    listed.push_back({{"path", f.name}, {"size", f.size}});
    bytes += f.size;
    digest.update(f.name.data(), f.name.size() + 1);
    digest.update(&f.size, sizeof f.size);
    digest.update(&f.footer_xxh3, sizeof f.footer_xxh3);
  }
  c.identity = fmt::format("{} ({}, {} bytes, digest {:016x})", some_of(names),
                           counted(static_cast<std::int64_t>(data.files.size()), "file"), bytes, digest.digest().xxh3);
  c.fingerprint = {{"files", listed},           {"rows", data.all_rows},
                   {"held_out", data.held_out}, {"split", std::string(name_of(options.split))},
                   {"seed", options.seed},      {"shuffle", options.shuffle},
                   {"rank", options.rank},      {"world_size", options.world_size}};
  c.options = std::move(options);
  c.start();
}

latent_parquet_dataset::latent_parquet_dataset(latent_parquet_dataset&&) noexcept = default;
latent_parquet_dataset& latent_parquet_dataset::operator=(latent_parquet_dataset&&) noexcept = default;
latent_parquet_dataset::~latent_parquet_dataset() = default;

latent_batch latent_parquet_dataset::next() {
  impl& c = *core_;
  std::vector<decoded_row> rows;
  for (std::int64_t b = 0; b < c.options.batch_size; ++b) rows.push_back(c.next_row());
  return stacked(rows, c.options.text_len);
}

latent_batch latent_parquet_dataset::at(std::span<const std::int64_t> rows) const {
  const impl& c = *core_;
  const catalog& data = c.data;
  if (rows.empty()) throw_error<std::invalid_argument>("{}: at() was given no rows", who);
  // Each row group read once, for all the rows asked of it.
  std::map<std::size_t, std::vector<std::int64_t>> wanted;
  for (const std::int64_t row : rows) {
    if (row < 0 || row >= data.end - data.begin) {
      throw_error<std::invalid_argument>("{}: row {} is not in the {} split's {}", who, row, name_of(c.options.split),
                                         counted(data.end - data.begin, "row"));
    }
    const std::int64_t global = data.begin + row;
    const auto g = static_cast<std::size_t>(std::ranges::upper_bound(data.groups, global, {}, &row_group::first) -
                                            data.groups.begin() - 1);
    wanted[g].push_back(global - data.groups[g].first);
  }
  group_reader files(data);
  std::map<std::int64_t, decoded_row> found;
  for (const auto& [g, in_group] : wanted)
    for (decoded_row& row : files.read(g, in_group)) found.emplace(row.row, std::move(row));
  std::vector<decoded_row> ordered;
  for (const std::int64_t row : rows) ordered.push_back(found.at(row));
  return stacked(ordered, c.options.text_len);
}

std::string latent_parquet_dataset::state() const {
  const impl& c = *core_;
  return json{{"dataset", c.fingerprint}, {"epoch", c.epoch}, {"rows_read", c.read}}.dump();
}

void latent_parquet_dataset::restore(std::string_view state) {
  impl& c = *core_;
  const json saved = detail::saved_state_of(state, c.fingerprint, who);
  std::int64_t epoch = 0, read = 0;
  try {
    epoch = saved.at("epoch").get<std::int64_t>();
    read = saved.at("rows_read").get<std::int64_t>();
  } catch (const json::exception& error) {
    throw_error<std::invalid_argument>("{}: the state to restore is damaged: {}", who, error.what());
  }
  if (epoch < 0 || read < 0 || read >= c.rank_rows())
    throw_error<std::invalid_argument>("{}: the state to restore is damaged: its position is past the data", who);
  c.stop();
  c.epoch = epoch;
  c.read = read;
  c.start();
}

const std::string& latent_parquet_dataset::identity() const noexcept { return core_->identity; }
std::int64_t latent_parquet_dataset::epoch() const noexcept { return core_->epoch; }
std::int64_t latent_parquet_dataset::rows() const noexcept { return core_->data.end - core_->data.begin; }
std::int64_t latent_parquet_dataset::rank_rows() const noexcept { return core_->rank_rows(); }
std::int64_t latent_parquet_dataset::held_out_rows() const noexcept { return core_->data.held_out; }

}  // namespace loom::data
