# Resolves AMPSCOPE_CUDA (AUTO / ON / OFF) into AMPSCOPE_WITH_CUDA and enables the CUDA language.
set(AMPSCOPE_WITH_CUDA OFF)
string(TOUPPER "${AMPSCOPE_CUDA}" _ampscope_cuda)
if(NOT _ampscope_cuda MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "AMPSCOPE_CUDA must be AUTO, ON or OFF, got '${AMPSCOPE_CUDA}'")
endif()

if(NOT _ampscope_cuda STREQUAL "OFF")
  # nvcc is often installed but not on PATH (/usr/local/cuda/bin); point CMake at it.
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(AMPSCOPE_NVCC nvcc HINTS ENV CUDA_PATH ENV CUDA_HOME PATH_SUFFIXES bin
                 PATHS /usr/local/cuda/bin /usr/local/cuda)
    if(AMPSCOPE_NVCC)
      set(CMAKE_CUDA_COMPILER "${AMPSCOPE_NVCC}")
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(AMPSCOPE_WITH_CUDA ON)
  elseif(_ampscope_cuda STREQUAL "ON")
    message(FATAL_ERROR "AMPSCOPE_CUDA=ON but no CUDA compiler (nvcc) was found.\n"
                        "hint: install the CUDA Toolkit and put nvcc on PATH (or set CUDACXX=/usr/local/cuda/bin/nvcc), "
                        "or configure with -DAMPSCOPE_CUDA=OFF (or AUTO) to build the CPU backend only.")
  else()
    message(STATUS "ampscope: no nvcc found, building without the CUDA backend (AMPSCOPE_CUDA=AUTO)")
  endif()
endif()

if(AMPSCOPE_WITH_CUDA)
  # CMake 3.25 does not know nvcc's C++20 flag and fails at generate time ("requires CUDA20").
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  # One cudart, shared, for everything: otherwise the link line mixes the shared and static runtimes.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  # nvcc fuses a * b + c into one FMA (one rounding) by default; the CPU backend rounds twice. The
  # backends must round identically, so contraction is off (matrix products go through cuBLAS anyway).
  add_compile_options("$<$<COMPILE_LANGUAGE:CUDA>:-fmad=false>")
endif()
