# tiktoken BPE encode/decode on arbitrary text, with the test vocabulary of tests/tokenizer/golden (3,840 ranks,
# Kimi-layout specials). Needs PCRE2, linked statically as in src/CMakeLists.txt.
if(PCRE2_INCLUDE_DIR AND PCRE2_STATIC_LIB)
  ds_add_fuzzer(tokenizer ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer_fuzz.cpp
                tokenizer/tiktoken.cpp tokenizer/tiktoken_bpe.cpp tokenizer/tokenizer.cpp
                tokenizer/tokenizer_loader.cpp tokenizer/byte_tokenizer.cpp core/error.cpp
                FLAGS -DDS_SOURCE_DIR="${PROJECT_SOURCE_DIR}" -DPCRE2_CODE_UNIT_WIDTH=8 -DPCRE2_STATIC
                      -DDELTASERVE_WITH_TIKTOKEN=1 -I${PCRE2_INCLUDE_DIR} ${PCRE2_STATIC_LIB})
else()
  message(STATUS "fuzz: PCRE2 not found, tokenizer fuzz target skipped")
endif()
