# What an OpenAI-compatible server sends to `deltaserve bench` / `eval` (tools/openai.cpp), through to the
# JSON records the tools write.
include(${CMAKE_CURRENT_LIST_DIR}/tools_link.cmake)
if(DEFINED DS_FUZZ_TOOLS_SRC)
  ds_add_fuzzer(client_stream ${CMAKE_CURRENT_SOURCE_DIR}/client_stream_fuzz.cpp ${DS_FUZZ_TOOLS_SRC}
                FLAGS ${DS_FUZZ_TOOLS_FLAGS})
endif()
