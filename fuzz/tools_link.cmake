# Shared by the client-tool fuzz targets (client_stream, gsm8k_extract, recipe_matrix); defines no target itself
# (it is globbed like the others, hence the guard). The tools reach each other (gsm8k -> bench progress -> HTTP
# client ...), and their only dependencies outside src/tools are core and cpp-httplib, so every target links all
# of src/tools, and new tool files are picked up. httplib's pkg-config defines must match the library's (see
# src/CMakeLists.txt: they change class layouts).
include_guard(GLOBAL)
if(HTTPLIB_INCLUDE_DIR)
  file(GLOB DS_FUZZ_TOOLS_SRC RELATIVE ${PROJECT_SOURCE_DIR}/src CONFIGURE_DEPENDS
       ${PROJECT_SOURCE_DIR}/src/tools/*.cpp)
  list(SORT DS_FUZZ_TOOLS_SRC)
  list(APPEND DS_FUZZ_TOOLS_SRC core/error.cpp core/subprocess.cpp)
  set(DS_FUZZ_TOOLS_FLAGS -I${HTTPLIB_INCLUDE_DIR} -lpthread)
  if(HTTPLIB_LIB)
    find_package(PkgConfig QUIET)
    if(PkgConfig_FOUND)
      pkg_check_modules(DS_FUZZ_HTTPLIB QUIET cpp-httplib)
    endif()
    list(PREPEND DS_FUZZ_TOOLS_FLAGS ${DS_FUZZ_HTTPLIB_CFLAGS_OTHER})
    list(APPEND DS_FUZZ_TOOLS_FLAGS ${HTTPLIB_LIB})
  endif()
else()
  message(STATUS "fuzz: cpp-httplib not found, client tool fuzz targets skipped")
endif()
