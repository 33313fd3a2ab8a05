# The tokenizer files of a model folder (tokenizer_loader.cpp's load_tiktoken_bpe, from memory): tiktoken.model
# parsing, the special-token table from tokenizer_config.json, and TiktokenBpe over the fuzzed vocabulary.
if(PCRE2_INCLUDE_DIR AND PCRE2_STATIC_LIB)
  ds_add_fuzzer(tiktoken_model ${CMAKE_CURRENT_SOURCE_DIR}/tiktoken_model_fuzz.cpp
                tokenizer/tiktoken.cpp tokenizer/tiktoken_bpe.cpp tokenizer/tokenizer.cpp
                tokenizer/tokenizer_loader.cpp tokenizer/byte_tokenizer.cpp core/error.cpp
                FLAGS -DPCRE2_CODE_UNIT_WIDTH=8 -DPCRE2_STATIC -DDELTASERVE_WITH_TIKTOKEN=1
                      -I${PCRE2_INCLUDE_DIR} ${PCRE2_STATIC_LIB})
endif()
