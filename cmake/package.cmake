# What users build against (docs/api.md, "Building your own program against ampscope"):
#
#   ampscope::ampscope  the runtime (tensors, ops, autograd, nn, autocast, GradScaler, optimizers,
#                       checkpoints, the CPU backend and the CUDA backend when built with it), the probe,
#                       the trace writer, reader and analysis, and GPT-2's tokenizer and the token files
#                       (ampscope::models: models/bpe_tokenizer.h, models/token_data.h);
#   ampscope::reader    the trace reader and the analysis only (with the trace writer, which lives in the
#                       same library): no runtime, no BLAS, no CUDA, for tools that only read traces.
#
# Both are targets of this build (add_subdirectory consumers) and of the installed package
# (find_package(ampscope CONFIG)): `cmake --install` puts the libraries, the staged headers
# (cmake/headers.cmake), the `ampscope` command and ampscopeConfig.cmake under the prefix. Nothing
# installed names a path of the source or build tree: the export files locate everything from their own
# position, and dependencies are found again on the user's machine (ampscopeConfig.cmake.in).

add_library(ampscope_all INTERFACE)
target_link_libraries(ampscope_all INTERFACE ampscope_core ampscope_probes ampscope_trace ampscope_analysis ampscope_models)
set_target_properties(ampscope_all PROPERTIES EXPORT_NAME ampscope)
add_library(ampscope::ampscope ALIAS ampscope_all)

add_library(ampscope_reader INTERFACE)
target_link_libraries(ampscope_reader INTERFACE ampscope_trace ampscope_analysis)
set_target_properties(ampscope_reader PROPERTIES EXPORT_NAME reader)
add_library(ampscope::reader ALIAS ampscope_reader)

# The libraries behind them, as ampscope::core, ampscope::trace, ... in the export.
set(_ampscope_libraries ampscope_base ampscope_kernels_cpu ampscope_core ampscope_trace ampscope_analysis
                        ampscope_probes ampscope_models)
if(TARGET ampscope_kernels_cuda)
  list(APPEND _ampscope_libraries ampscope_kernels_cuda)
endif()
foreach(_lib IN LISTS _ampscope_libraries)
  string(REGEX REPLACE "^ampscope_" "" _export_name ${_lib})
  set_target_properties(${_lib} PROPERTIES EXPORT_NAME ${_export_name})
endforeach()

if(NOT AMPSCOPE_INSTALL)
  return()
endif()

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
set(AMPSCOPE_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/ampscope CACHE STRING
    "Where ampscopeConfig.cmake is installed, relative to the prefix")

install(TARGETS ampscope_all ampscope_reader ampscope_headers ${_ampscope_libraries}
        EXPORT ampscopeTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT ampscopeTargets NAMESPACE ampscope:: DESTINATION ${AMPSCOPE_INSTALL_CMAKEDIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ampscopeConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/ampscopeConfig.cmake
                              INSTALL_DESTINATION ${AMPSCOPE_INSTALL_CMAKEDIR})
# 0.x: a minor version may break the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ampscopeConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ampscopeConfig.cmake ${PROJECT_BINARY_DIR}/ampscopeConfigVersion.cmake
        DESTINATION ${AMPSCOPE_INSTALL_CMAKEDIR})
if(AMPSCOPE_WITH_NCCL)
  # How the package finds NCCL again on the user's machine (ampscopeConfig.cmake includes it).
  install(FILES ${PROJECT_SOURCE_DIR}/cmake/nccl.cmake DESTINATION ${AMPSCOPE_INSTALL_CMAKEDIR}
          RENAME ampscopeNccl.cmake)
endif()
