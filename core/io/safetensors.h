// core/io/safetensors.h: reading and writing safetensors files (the Hugging Face weight format) and
// Hugging Face model folders (model.safetensors, or model.safetensors.index.json and its shards).
// A file is: an 8-byte little-endian header length N, N bytes of UTF-8 JSON (tensor name ->
// {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional "__metadata__" of string -> string),
// then the byte buffer the offsets point into. Every rule is checked at open; docs/checkpoints.md lists them.
//
//   auto file = ampscope::safetensors::File::open("model.safetensors");
//   ampscope::Tensor w = file.load("wte.weight", ampscope::DType::f32);  // f16/bf16 widened exactly
//   ampscope::safetensors::save("out.safetensors", {{"w", w}}, {{"format", "pt"}});
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace ampscope::safetensors {

// A file that breaks the format, or a tensor or shard that is not there. The message names the file,
// the tensor and what is wrong.
class FormatError : public Error {
 public:
  using Error::Error;
};

// Header lengths above this are refused (the reference implementation's cap is 100 MB as well).
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  std::string dtype_name;  // as in the file: "F32", "F16", "BF16", "F64", "I64"
  Shape shape;
  std::uint64_t begin = 0, end = 0;  // byte offsets in the buffer after the header
};

// The safetensors names ("F32", "F16", "BF16", "F64", "I64") of the dtypes this reader and writer support.
std::string stored_name(DType dtype);  // throws DTypeError for bool
std::optional<DType> from_stored_name(std::string_view name);

// One memory-mapped, validated safetensors file. Movable; the mapping is released with the last copy.
// open() refuses anything but a regular file before opening it (a FIFO would block), and parses the header
// in time linear in its length, its JSON nesting bounded (core/io/json_limits.h).
class File {
 public:
  static File open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in name order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(std::string_view name) const;
  const TensorInfo& info(std::string_view name) const;  // throws FormatError naming the file

  // A new CPU tensor with the file's values, converted to `as` when given (Tensor::to's rounding; f16 and
  // bf16 widen to f32 exactly).
  Tensor load(std::string_view name, std::optional<DType> as = std::nullopt) const;

 private:
  struct Mapping;
  std::filesystem::path path_;
  std::shared_ptr<const Mapping> map_;
  std::uint64_t buffer_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (any device, any layout: copied to contiguous CPU values) in name order, contiguous,
// little-endian, header padded with spaces to a multiple of 8 bytes. Written through an OutputFile
// (core/io/output_file.h: a fresh temporary name, fsynced and renamed); a symbolic link, FIFO or folder at
// `path` is refused (Error naming it), never written through. Throws on duplicate or empty names, undefined
// tensors, bool tensors, a "__metadata__" tensor.
void save(const std::filesystem::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
          const std::map<std::string, std::string>& metadata = {});

// A tensor of a folder that holds NaN or Inf once loaded (load_folder's `nonfinite`).
struct NonFiniteTensor {
  std::string name;          // as the folder names it
  std::string file;          // the .safetensors file that holds it
  std::string stored_dtype;  // as the file names it: "F64"
  std::int64_t nans = 0, infs = 0, count = 0;  // once loaded; count: all its values
  std::int64_t first = -1;                     // the flat index of the first NaN or Inf
  // Of the NaN and Inf, how many the file holds as finite values: an F64 1e300 is Inf once loaded as f32.
  std::int64_t overflowed = 0;
  // "tensor 'w' ('DIR/model.safetensors') holds 1 NaN and 2 Inf of its 6 values (the first at flat index 0);
  // 2 of them are finite F64 values in the file, beyond the range of the dtype they were loaded as"
  std::string describe() const;
};

// Every tensor of a Hugging Face folder by name: model.safetensors, or model.safetensors.index.json
// ("weight_map": name -> shard file) with its shards. Errors name the shard and the tensor. Every file is
// opened only when it is a regular file (a FIFO or a device is refused by name; the index is read up to
// 64 MiB and its JSON nesting bounded). With `nonfinite`, every floating-point tensor is checked once
// converted to `as`, and those that hold NaN or Inf are listed there (in the order loaded); what to do
// about them is the caller's (hf::load_model refuses them unless allowed).
std::map<std::string, Tensor> load_folder(const std::filesystem::path& folder,
                                          std::optional<DType> as = std::nullopt,
                                          std::vector<NonFiniteTensor>* nonfinite = nullptr);

}  // namespace ampscope::safetensors
