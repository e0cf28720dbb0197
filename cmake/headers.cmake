# The public headers, as users include them: <ampscope/core/ops.h>, <ampscope/probes/probe.h>.
#
# The source tree keeps its include root (the repository root: "core/tensor.h"), which only the project's
# own code sees (ampscope_source_tree below). Users see a staged copy under the build folder,
# ${PROJECT_BINARY_DIR}/include/ampscope/..., whose `#include "core/x.h"` lines (and "probes/", "kernels/")
# read `#include "ampscope/core/x.h"`: a user's own core/ folder can then neither shadow ours nor be
# shadowed by it. The copies are made at build time (cmake/stage_header.cmake), so editing a header
# needs no re-configure; add_subdirectory consumers use them from the build folder, installed packages
# from <prefix>/include (cmake/package.cmake).
#
# Which headers are public: every header of core/ and probes/ except the internal ones listed here;
# of models/, the tokenizer and the token files (AMPSCOPE_PUBLIC_MODEL_HEADERS: docs/checkpoints.md shows
# them), not the Hugging Face architectures, whose interfaces take nlohmann::json (no installed header
# includes a JSON header); none of kernels/ (the backends' internals: CUDA launchers, fused kernels, CPU loops). A public header
# that includes an internal one is refused here, at configure time, and again at build time by the
# staging script (which sees edits made since).

set(AMPSCOPE_INTERNAL_HEADERS
    core/cpu_gemm.h          # the CPU GEMM the FP8 and block-scaled Linears share
    core/io/output_file.h    # safe creation of the command line's output files (cli/)
    core/io/hdf5_support.h   # HDF5 helpers for checkpoint.cpp and the trace writer/reader (includes hdf5.h)
    core/io/json_limits.h    # bounded JSON parsing for the readers of files from elsewhere (includes nlohmann)
    core/io/input_file.h     # regular-file-only, size-bounded opening of files from elsewhere (for the readers)
    probes/trace/codec.h  # the trace's chunk compression
    probes/trace/hdf5_io.h   # the trace's HDF5 wrappers
    probes/trace/layout.h # the trace's dataset layout
    probes/trace/layout_v3.h # the fixed-width layouts of format_version 1 to 3, for the reader
    probes/analysis/f16_ranges.h   # the analysis's fp16 range tables
    probes/analysis/scaler_calibration.h # the calibration test the analysis and the diff share
    core/distributed/mpi_process_group.h # the MPI process group's factory (its .cpp is the only file that includes mpi.h)
)

set(AMPSCOPE_PUBLIC_MODEL_HEADERS
    models/bpe_tokenizer.h   # GPT-2's byte-level BPE tokenizer (ampscope_models)
    models/token_data.h      # token files (.npy, .bin, .txt) and their batching (ampscope_models)
)

file(GLOB _ampscope_header_paths CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}
     ${PROJECT_SOURCE_DIR}/core/*.h ${PROJECT_SOURCE_DIR}/core/*/*.h
     ${PROJECT_SOURCE_DIR}/probes/*.h ${PROJECT_SOURCE_DIR}/probes/*/*.h)
list(APPEND _ampscope_header_paths ${AMPSCOPE_PUBLIC_MODEL_HEADERS})
set(AMPSCOPE_PUBLIC_HEADERS "")
foreach(_h IN LISTS _ampscope_header_paths)
  if(NOT _h IN_LIST AMPSCOPE_INTERNAL_HEADERS)
    list(APPEND AMPSCOPE_PUBLIC_HEADERS ${_h})
  endif()
endforeach()
list(SORT AMPSCOPE_PUBLIC_HEADERS)

# Every project include a public header makes must be public too.
foreach(_h IN LISTS AMPSCOPE_PUBLIC_HEADERS)
  file(STRINGS ${PROJECT_SOURCE_DIR}/${_h} _includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"(core|probes|kernels|models)/")
  foreach(_line IN LISTS _includes)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*$" "\\1" _included "${_line}")
    if(NOT _included IN_LIST AMPSCOPE_PUBLIC_HEADERS)
      message(FATAL_ERROR "ampscope: the public header ${_h} includes ${_included}, which is not installed (a backend "
                          "internal or a header listed in AMPSCOPE_INTERNAL_HEADERS, cmake/headers.cmake).\n"
                          "hint: include it from the .cpp file instead, or, if users need it, make it public "
                          "(kernels/ headers never are)")
    endif()
  endforeach()
endforeach()

# The staging: one command per header, so an edit re-stages (and recompiles for) that header only.
set(AMPSCOPE_STAGED_INCLUDE_DIR ${PROJECT_BINARY_DIR}/include)
set(_ampscope_public_list ${PROJECT_BINARY_DIR}/ampscope_public_headers.txt)
file(CONFIGURE OUTPUT ${_ampscope_public_list} CONTENT "${AMPSCOPE_PUBLIC_HEADERS}\n" @ONLY)
set(AMPSCOPE_STAGED_HEADERS "")
foreach(_h IN LISTS AMPSCOPE_PUBLIC_HEADERS)
  set(_staged ${AMPSCOPE_STAGED_INCLUDE_DIR}/ampscope/${_h})
  add_custom_command(OUTPUT ${_staged}
                     COMMAND ${CMAKE_COMMAND} -DSOURCE=${PROJECT_SOURCE_DIR}/${_h} -DDESTINATION=${_staged}
                             -DNAME=${_h} -DPUBLIC_LIST=${_ampscope_public_list}
                             -P ${PROJECT_SOURCE_DIR}/cmake/stage_header.cmake
                     DEPENDS ${PROJECT_SOURCE_DIR}/${_h} ${PROJECT_SOURCE_DIR}/cmake/stage_header.cmake
                             ${_ampscope_public_list}
                     COMMENT "Staging ampscope/${_h}" VERBATIM)
  list(APPEND AMPSCOPE_STAGED_HEADERS ${_staged})
endforeach()
add_custom_target(ampscope_stage_headers DEPENDS ${AMPSCOPE_STAGED_HEADERS})

# ampscope_headers (exported as ampscope::headers): the staged include root and C++20, linked PUBLIC by
# every library of the package. Dependencies of an INTERFACE library are followed by whatever links it,
# so anything that compiles against the staged headers waits for them.
add_library(ampscope_headers INTERFACE)
target_sources(ampscope_headers INTERFACE FILE_SET HEADERS BASE_DIRS ${AMPSCOPE_STAGED_INCLUDE_DIR}
               FILES ${AMPSCOPE_STAGED_HEADERS})
target_compile_features(ampscope_headers INTERFACE cxx_std_20)
add_dependencies(ampscope_headers ampscope_stage_headers)
set_target_properties(ampscope_headers PROPERTIES EXPORT_NAME headers)

# ampscope_source_tree: the repository root as include root ("core/tensor.h"), for the libraries' own
# sources and the project's own programs (samples, tests, benchmarks, viewer). Never exported, never
# seen by users, so nothing outside this project depends on the source layout.
add_library(ampscope_source_tree INTERFACE)
target_include_directories(ampscope_source_tree INTERFACE ${PROJECT_SOURCE_DIR})
