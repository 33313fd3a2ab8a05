# GSM8K answer extraction, normalisation, scoring and band parsing (tools/gsm8k.cpp).
include(${CMAKE_CURRENT_LIST_DIR}/tools_link.cmake)
if(DEFINED DS_FUZZ_TOOLS_SRC)
  ds_add_fuzzer(gsm8k_extract ${CMAKE_CURRENT_SOURCE_DIR}/gsm8k_extract_fuzz.cpp ${DS_FUZZ_TOOLS_SRC}
                FLAGS ${DS_FUZZ_TOOLS_FLAGS})
endif()
