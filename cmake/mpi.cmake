# Resolves AMPSCOPE_MPI into AMPSCOPE_WITH_MPI: the MPI process group (core/distributed/mpi_process_group.cpp,
# docs/distributed.md). ON by default when MPI's C library is found (Debian: libopenmpi-dev, which
# scripts/setup.sh installs); OFF otherwise, and then make_process_group() gives the single-process group
# (and refuses a multi-process mpirun launch clearly). Only the C API is used, so Open MPI's deprecated
# C++ bindings are kept out (OMPI_SKIP_MPICXX, on the one file that includes mpi.h).
find_package(MPI COMPONENTS C QUIET)
option(AMPSCOPE_MPI "Build the MPI process group (default: ON when MPI is found, e.g. Debian's libopenmpi-dev)"
       ${MPI_C_FOUND})
set(AMPSCOPE_WITH_MPI OFF)
if(AMPSCOPE_MPI)
  if(NOT MPI_C_FOUND)
    message(FATAL_ERROR "AMPSCOPE_MPI=ON but no MPI was found.\n"
                        "hint: install Open MPI (apt-get install libopenmpi-dev openmpi-bin, or scripts/setup.sh), "
                        "or configure with -DAMPSCOPE_MPI=OFF to build without the MPI process group.")
  endif()
  set(AMPSCOPE_WITH_MPI ON)
  message(STATUS "ampscope: MPI process group (MPI ${MPI_C_VERSION}: ${MPI_C_LIBRARIES}), launcher "
                 "${MPIEXEC_EXECUTABLE}")
elseif(MPI_C_FOUND)
  message(STATUS "ampscope: building without the MPI process group (AMPSCOPE_MPI=OFF)")
else()
  message(STATUS "ampscope: no MPI found, building without the MPI process group (single process only; "
                 "Debian: libopenmpi-dev openmpi-bin, then -DAMPSCOPE_MPI=ON)")
endif()
