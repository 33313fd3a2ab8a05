# Helpers shared by the CMake files: one place that says how a library, a test and a fuzzer are built.

# ds_glob(<var> <dir> <patterns...>): sources of one folder; new files are picked up without editing CMake.
function(ds_glob var dir)
  set(_all)
  foreach(p ${ARGN})
    file(GLOB _f CONFIGURE_DEPENDS "${dir}/${p}")
    list(APPEND _all ${_f})
  endforeach()
  list(SORT _all)
  set(${var} ${_all} PARENT_SCOPE)
endfunction()

function(ds_target_defaults tgt)
  target_compile_options(${tgt} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${DS_WARNINGS}>)
  target_compile_options(${tgt} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo -Xcompiler=-Wall>)
  # CUDA sources are C++17 (CMakeLists.txt says why); an empty FMT_CONSTEVAL keeps fmt's format-string checks
  # at run time should they ever build as C++20 (nvcc 13 with g++ 13 rejects the consteval form there).
  target_compile_definitions(${tgt} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:FMT_CONSTEVAL=>)
  target_include_directories(${tgt} PUBLIC ${PROJECT_SOURCE_DIR}/src)
endfunction()

# ds_add_test(<name> SOURCES ... LIBS ...): one GoogleTest binary; every TEST becomes a CTest entry.
function(ds_add_test name)
  cmake_parse_arguments(A "" "" "SOURCES;LIBS" ${ARGN})
  if(NOT A_SOURCES)
    return()
  endif()
  add_executable(${name} ${A_SOURCES})
  ds_target_defaults(${name})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/tests)
  # Test data is found from the source tree's root, never from __FILE__ (ccache's base_dir makes it relative).
  target_compile_definitions(${name} PRIVATE DS_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  target_link_libraries(${name} PRIVATE ${A_LIBS} GTest::gtest GTest::gtest_main Threads::Threads)
  include(GoogleTest)
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 900)
endfunction()

# ds_add_library(<name> SOURCES ... DEPS ...): a static library, or an interface one while the folder is empty.
function(ds_add_library name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS" ${ARGN})
  if(A_SOURCES)
    add_library(${name} STATIC ${A_SOURCES})
    ds_target_defaults(${name})
    target_link_libraries(${name} PUBLIC ${A_DEPS})
  else()
    add_library(${name} INTERFACE)
    target_include_directories(${name} INTERFACE ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(${name} INTERFACE ${A_DEPS})
  endif()
endfunction()
