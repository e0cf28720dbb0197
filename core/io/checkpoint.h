// core/io/checkpoint.h: saving a training run to one HDF5 file and resuming it bit for bit.
//
// A checkpoint holds, each piece optional: a model's parameters and buffers, an optimizer's groups
// (hyper-parameters, current lr included) and per-parameter state, named StateDicts (the GradScaler's
// state_dict(), a run configuration), the seed and offset of named Generators, and the step counter.
// Saving writes a temporary file beside the target and renames it over the target, so a crash leaves
// either the old checkpoint or the new one, never half of one. Loading reads and checks everything
// first and changes nothing unless every piece fits: a CheckpointError names the file, the piece and
// the values that disagree, and the model, optimizer, generators and StateDicts are left as they were.
//
//   Checkpoint ck{.model = model.get(), .optimizer = &opt, .generators = {{"dropout", &gen}},
//                 .states = {{"scaler", scaler.state_dict()}, {"run", run_config}}, .step = step};
//   save_checkpoint("run/ckpt.h5", ck);
//   ...                                        // later, in a new process, with freshly built objects:
//   load_checkpoint("run/ckpt.h5", ck);        // model, optimizer, gen, ck.states and ck.step replaced
//   scaler.load_state_dict(ck.states.at("scaler"));
//
// The layout (readable with h5py and h5dump; docs in the comments of checkpoint.cpp):
//   /                              attributes format = "ampscope checkpoint", format_version = 2, step
//   /model/<name>                  one dataset per parameter and buffer ("/model/blocks.0.attn.qkv.weight")
//   /optimizer                     attribute type ("Adam")
//   /optimizer/param_groups/<g>    hyper-parameters as attributes; dataset "params": the parameter names
//   /optimizer/state/<name>/...    datasets momentum_buffer, exp_avg, exp_avg_sq, max_exp_avg_sq; attribute step
//   /generators/<name>             attributes seed, offset (unsigned 64-bit)
//   /states/<name>                 scalar values as attributes (f64, i64, bool, UTF-8 string), tensors as datasets
//
// Checksums (format version 2): every dataset has a u32 attribute ampscope_crc32, zlib's CRC-32 over its
// name, HDF5 type class and size, dimensions and raw bytes; every group or root that holds values as
// attributes has a u32[n] attribute ampscope_crc32 with one CRC-32 per other attribute (name order),
// over its name, type class and size, element count and raw bytes. Strings are fixed-length, so nothing
// lives in HDF5's unchecksummed global heap. A load verifies every value it reads before it applies any.
//
// Tensors keep their dtype and bits: f64/f32 as IEEE types, f16 as a 16-bit HDF5 float type with
// binary16's layout (what h5py writes for numpy float16), bf16 as a 16-bit HDF5 float type with
// 8 exponent and 7 mantissa bits, i64 as a 64-bit integer, bool as h5py's FALSE/TRUE enum. See
// checkpoint.cpp for why.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/nn.h"
#include "core/optim.h"
#include "core/random.h"
#include "core/io/state_dict.h"

namespace ampscope {

// A checkpoint that cannot be written, read, or does not fit what it is loaded into. The message names
// the file, then the piece (parameter, optimizer group, state key) and both sides' values; failures
// inside HDF5 carry HDF5's own error stack.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// The layout version this build writes and the newest it reads. Version 1 (no checksums, variable-length
// strings) is still read, with a warning in LoadReport::warnings.
inline constexpr std::int64_t kCheckpointFormatVersion = 2;

// How a load treats values it could take but might not want.
struct CheckpointLoadOptions {
  // Accept NaN and Inf in model parameters and buffers and in optimizer state. Off: such a value is an
  // error naming the tensor (a run that diverged before it saved would resume straight into NaN).
  bool allow_nonfinite = false;
};

// What a successful load found.
struct CheckpointLoadReport {
  std::int64_t format_version = 0;
  bool checksums_verified = false;     // false only for version 1 files, which have none
  std::vector<std::string> warnings;   // one line each: unverified values, allowed non-finite tensors
};

// What to save, or what to load into. The pointers are not owned; a null pointer or an empty map
// leaves that piece out (it is neither written nor read, even when the file holds it).
struct Checkpoint {
  // Saved by named_parameters() and named_buffers() names. Loading requires exactly the same names,
  // shapes and dtypes (a missing or extra parameter is an error), then copies the values in place.
  nn::Module* model = nullptr;
  // Its parameters are identified by Tensor::name() (set by modules), which must be unique and not
  // empty. Loading requires the same optimizer type and groups holding the same parameter names; it
  // replaces every group's hyper-parameters (lr, initial_lr, ...) and every parameter's state.
  optim::Optimizer* optimizer = nullptr;
  // Seed and offset of each; loading requires each name to be in the file.
  std::map<std::string, Generator*> generators{};
  // Saved as they are. When loading, each entry is a template: the file must hold a StateDict of that
  // name with exactly the same keys and value types (tensors: the same dtype and shape), which then
  // replaces it. An empty template accepts whatever keys the file holds (a free-form run configuration).
  std::map<std::string, StateDict> states{};
  std::int64_t step = 0;
};

// Writes `what` to `path` atomically: a temporary file in the same directory (".NAME.tmp-PID-N"),
// flushed to disk, then renamed over `path`. On failure (disk full included) the temporary file is
// removed and `path` is untouched. Keys and names must not contain '/' (they become HDF5 link names),
// and StateDict keys must not be "ampscope_crc32". Temporary files of this target left by saves in
// processes that no longer exist (killed during a save) are removed first; those of live processes are
// left alone (they may be saving right now).
void save_checkpoint(const std::filesystem::path& path, const Checkpoint& what);

// Reads `path` into the pieces `into` names, after checking that every piece fits, that every value
// read matches its checksum, and (unless options allow it) that no parameter, buffer or optimizer
// state holds NaN or Inf; on any error nothing in `into` (or what it points to) has changed. Only
// regular files are opened (a FIFO or a directory is an error at once). Model values are copied into
// the existing parameter tensors (so an optimizer holding them stays valid), on whatever device they
// live.
CheckpointLoadReport load_checkpoint(const std::filesystem::path& path, Checkpoint& into,
                                     const CheckpointLoadOptions& options = {});

}  // namespace ampscope
