# Stages one public header for users (cmake/headers.cmake): copies SOURCE to DESTINATION with each
# `#include "core/...`, `"probes/...` and `"kernels/...` line rewritten to `#include "ampscope/core/...`
# and so on. An include of a header that is not public (PUBLIC_LIST, written at configure time) fails
# the build, naming both headers. DESTINATION is left untouched when its content would not change, so
# an edit to one header recompiles only what includes it.
#   cmake -DSOURCE=core/ops.h -DDESTINATION=build/include/ampscope/core/ops.h -DNAME=core/ops.h
#         -DPUBLIC_LIST=build/ampscope_public_headers.txt -P cmake/stage_header.cmake
cmake_minimum_required(VERSION 3.25)
foreach(_var SOURCE DESTINATION NAME PUBLIC_LIST)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "stage_header.cmake: -D${_var}=... is required")
  endif()
endforeach()

file(READ "${PUBLIC_LIST}" _public)
string(STRIP "${_public}" _public)
file(READ "${SOURCE}" _text)

# Only real include directives: at the start of a line (a leading newline makes the first line one too),
# so an include quoted in a comment is left as it is.
set(_text "\n${_text}")
set(_directive "\n([ \t]*#[ \t]*include[ \t]*\")((core|probes|kernels|models)/[^\"]+)\"")
string(REGEX MATCHALL "${_directive}" _matches "${_text}")
foreach(_match IN LISTS _matches)
  string(REGEX REPLACE "${_directive}" "\\2" _included "${_match}")
  if(NOT _included IN_LIST _public)
    message(FATAL_ERROR "ampscope: the public header ${NAME} includes ${_included}, which is not installed (a "
                        "backend internal, an internal header listed in cmake/headers.cmake, or a header "
                        "added since CMake last ran).\n"
                        "hint: include it from the .cpp file instead; if users need it, make it public and "
                        "re-run cmake")
  endif()
endforeach()
string(REGEX REPLACE "${_directive}" "\n\\1ampscope/\\2\"" _text "${_text}")
string(SUBSTRING "${_text}" 1 -1 _text)

if(EXISTS "${DESTINATION}")
  file(READ "${DESTINATION}" _old)
  if(_old STREQUAL _text)
    return()
  endif()
endif()
file(WRITE "${DESTINATION}" "${_text}")
