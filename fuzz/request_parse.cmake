# Request parsing and prompt preparation on arbitrary bytes (no server): the first byte picks the endpoint.
ds_add_fuzzer(request_parse ${CMAKE_CURRENT_SOURCE_DIR}/request_parse_fuzz.cpp
              server/request_parse.cpp server/prompt.cpp server/stop_matcher.cpp
              tokenizer/tokenizer.cpp tokenizer/byte_tokenizer.cpp runtime/sampler.cpp core/error.cpp)
