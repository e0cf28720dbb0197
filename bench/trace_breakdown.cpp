// Where a trace's bytes go (issue 37): for each table, the bytes its chunks take in the file (H5Dget_chunk_info,
// so a chunk's zero padding counts), per op row of the trace; the file's other bytes (HDF5's metadata, and the
// slots of chunks that outgrew them and moved: the writer cannot reuse them under SWMR); and for /ops, each
// field's share: every stored chunk inflated (ChunkDecoder) and each field's byte columns deflated on their own,
// at the file's level, with the strategy the writer uses for them (zlib's run-length one for floating-point
// fields), so the fields' figures add up to about the table's (they differ by the stream's framing and by
// matches across fields). A plain program; trace_bench --keep DIR leaves its traces there for it.
//
//   build/bench/trace_breakdown TRACE.h5 [LEVEL]   # LEVEL: the deflate level of the per-field figures (1)
#include <hdf5.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "probes/trace/codec.h"

namespace {

struct Field {
  std::string name;
  std::size_t offset = 0, size = 0;
  bool floating = false;
};

std::vector<Field> fields_of(hid_t type) {
  std::vector<Field> out;
  const int n = H5Tget_nmembers(type);
  for (int i = 0; i < n; ++i) {
    char* name = H5Tget_member_name(type, static_cast<unsigned>(i));
    const hid_t member = H5Tget_member_type(type, static_cast<unsigned>(i));
    out.push_back({name, H5Tget_member_offset(type, static_cast<unsigned>(i)), H5Tget_size(member),
                   H5Tget_member_class(type, static_cast<unsigned>(i)) == H5T_FLOAT});
    H5Tclose(member);
    H5free_memory(name);
  }
  return out;
}

std::size_t deflated_size(const std::byte* data, std::size_t size, int level, int strategy) {
  z_stream z{};
  if (deflateInit2(&z, level, Z_DEFLATED, -15, 8, strategy) != Z_OK) throw std::runtime_error("deflateInit2");
  std::vector<unsigned char> out(deflateBound(&z, static_cast<uLong>(size)) + 16);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(data));
  z.avail_in = static_cast<uInt>(size);
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) throw std::runtime_error("deflate");
  const std::size_t n = z.total_out;
  deflateEnd(&z);
  return n;
}

struct TableBytes {
  std::string name;
  hsize_t rows = 0, chunks = 0, chunk_bytes = 0;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: trace_breakdown TRACE.h5 [LEVEL]\nhint: trace_bench --keep DIR leaves its traces in DIR\n");
    return 2;
  }
  const std::filesystem::path path = argv[1];
  const int level = argc == 3 ? std::atoi(argv[2]) : 1;
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, H5P_DEFAULT);
  if (file < 0) {
    std::fprintf(stderr, "trace_breakdown: error: cannot open '%s' as an HDF5 file\n", path.c_str());
    return 1;
  }
  const auto file_bytes = static_cast<double>(std::filesystem::file_size(path));
  const char* tables[] = {"steps", "ops", "grads", "events", "histograms", "dumps", "dump_values", "strings",
                          "string_bytes", "precision", "updates", "checksums", "fp8", "blocks", "index"};
  std::vector<TableBytes> found;
  double op_rows = 0, in_chunks = 0;
  std::vector<Field> op_fields;
  std::map<std::string, double> op_field_bytes;
  double op_raw_deflated = 0;
  for (const char* name : tables) {
    const std::string where = fmt::format("/{}", name);
    if (H5Lexists(file, where.c_str(), H5P_DEFAULT) <= 0) continue;
    const hid_t d = H5Dopen2(file, where.c_str(), H5P_DEFAULT);
    const hid_t space = H5Dget_space(d);
    TableBytes t{.name = name};
    H5Sget_simple_extent_dims(space, &t.rows, nullptr);
    H5Dget_num_chunks(d, space, &t.chunks);
    const hid_t type = H5Dget_type(d);
    const std::size_t record = H5Tget_size(type);
    const hid_t dcpl = H5Dget_create_plist(d);
    hsize_t chunk_rows = 0;
    H5Pget_chunk(dcpl, 1, &chunk_rows);
    const bool compressed = H5Pget_nfilters(dcpl) > 0;
    const bool per_field = std::string(name) == "ops" && compressed;
    if (per_field) op_fields = fields_of(type);
    ampscope::trace::detail::ChunkDecoder decoder(record, chunk_rows);
    std::vector<std::byte> stored;
    for (hsize_t i = 0; i < t.chunks; ++i) {
      hsize_t offset = 0, size = 0;
      unsigned mask = 0;
      haddr_t addr = 0;
      H5Dget_chunk_info(d, space, i, &offset, &mask, &addr, &size);
      t.chunk_bytes += size;
      if (!per_field) continue;
      stored.resize(size);
      std::uint32_t filters = 0;
      H5Dread_chunk(d, H5P_DEFAULT, &offset, &filters, stored.data());
      if (!decoder.inflate(stored.data(), stored.size())) {
        std::fprintf(stderr, "trace_breakdown: error: chunk %llu of /ops does not inflate\n", static_cast<unsigned long long>(i));
        return 1;
      }
      // Only the chunk's rows within the table's extent (the last chunk's zeros beyond it left out).
      const std::size_t rows = static_cast<std::size_t>(std::min<hsize_t>(chunk_rows, t.rows - offset));
      for (const Field& f : op_fields) {
        std::vector<std::byte> columns;
        for (std::size_t b = f.offset; b < f.offset + f.size; ++b) {
          const std::byte* c = decoder.shuffled() + b * chunk_rows;
          columns.insert(columns.end(), c, c + rows);
        }
        op_field_bytes[f.name] += static_cast<double>(
            deflated_size(columns.data(), columns.size(), level, f.floating ? Z_RLE : Z_DEFAULT_STRATEGY));
      }
      op_raw_deflated += static_cast<double>(rows * record);
    }
    if (std::string(name) == "ops") op_rows = static_cast<double>(t.rows);
    in_chunks += static_cast<double>(t.chunk_bytes);
    found.push_back(t);
    H5Pclose(dcpl);
    H5Tclose(type);
    H5Sclose(space);
    H5Dclose(d);
  }
  H5Fclose(file);
  if (op_rows == 0) {
    std::fprintf(stderr, "trace_breakdown: error: '%s' has no op rows\n", path.c_str());
    return 1;
  }
  std::printf("%s: %.0f op rows, %.0f bytes, %.2f bytes per op row\n", path.filename().c_str(), op_rows, file_bytes,
              file_bytes / op_rows);
  std::printf("\n| table | rows | chunks | bytes in chunks | bytes per op row |\n|---|---:|---:|---:|---:|\n");
  for (const TableBytes& t : found) {
    std::printf("| /%s | %llu | %llu | %llu | %.2f |\n", t.name.c_str(), static_cast<unsigned long long>(t.rows),
                static_cast<unsigned long long>(t.chunks), static_cast<unsigned long long>(t.chunk_bytes),
                static_cast<double>(t.chunk_bytes) / op_rows);
  }
  std::printf("| the rest (HDF5 metadata, slots of moved chunks) | | | %.0f | %.2f |\n", file_bytes - in_chunks,
              (file_bytes - in_chunks) / op_rows);
  if (!op_fields.empty()) {
    std::printf("\n/ops per field, each deflated alone at level %d (%.0f raw bytes a row):\n\n", level,
                op_raw_deflated / op_rows);
    std::printf("| field | raw bytes per row | bytes per row after shuffle + deflate |\n|---|---:|---:|\n");
    double sum = 0;
    for (const Field& f : op_fields) {
      sum += op_field_bytes[f.name];
      std::printf("| %s | %zu%s | %.2f |\n", f.name.c_str(), f.size, f.floating ? " (f64)" : "", op_field_bytes[f.name] / op_rows);
    }
    std::printf("| all fields | %.0f | %.2f |\n", op_raw_deflated / op_rows, sum / op_rows);
  }
  return 0;
}
