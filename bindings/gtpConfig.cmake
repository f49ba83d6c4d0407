# find_package(gtp CONFIG) for libgtp's C ABI: the imported target gtp::gtp (include dir and libgtp.so).
# //:install puts this file in PREFIX/lib/cmake/gtp/. Relocatable: PREFIX is computed from this file's
# own location, so a prefix that is moved or copied elsewhere still works. The version check is in
# gtpConfigVersion.cmake.
get_filename_component(_gtp_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
foreach(_gtp_file "${_gtp_prefix}/include/gtp/gtp.h" "${_gtp_prefix}/lib/libgtp.so")
  if(NOT EXISTS "${_gtp_file}")
    set(gtp_FOUND FALSE)
    set(gtp_NOT_FOUND_MESSAGE "${_gtp_file} is missing; reinstall with `bazel run //:install -- PREFIX`")
    unset(_gtp_prefix)
    return()
  endif()
endforeach()
if(NOT TARGET gtp::gtp)
  add_library(gtp::gtp SHARED IMPORTED)
  set_target_properties(gtp::gtp PROPERTIES
    IMPORTED_LOCATION "${_gtp_prefix}/lib/libgtp.so"
    # libgtp.so has no SONAME: without this the linker would record its absolute path in the consumer.
    IMPORTED_NO_SONAME TRUE
    INTERFACE_INCLUDE_DIRECTORIES "${_gtp_prefix}/include")
endif()
set(gtp_INCLUDE_DIRS "${_gtp_prefix}/include")
set(gtp_LIBRARIES gtp::gtp)
unset(_gtp_prefix)
unset(_gtp_file)
