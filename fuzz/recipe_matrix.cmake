# Recipe files (recipes/recipes.json) and qualification matrices (tools/recipe.cpp, matrix.cpp, criterion.cpp).
include(${CMAKE_CURRENT_LIST_DIR}/tools_link.cmake)
if(DEFINED DS_FUZZ_TOOLS_SRC)
  ds_add_fuzzer(recipe_matrix ${CMAKE_CURRENT_SOURCE_DIR}/recipe_matrix_fuzz.cpp ${DS_FUZZ_TOOLS_SRC}
                FLAGS ${DS_FUZZ_TOOLS_FLAGS})
endif()
