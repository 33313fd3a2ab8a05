# Fuzzes the safetensors header parser (model/safetensors.cpp depends only on core and nlohmann_json).
ds_add_fuzzer(safetensors_header ${CMAKE_CURRENT_SOURCE_DIR}/safetensors_header_fuzz.cpp
              model/safetensors.cpp core/dtype.cpp core/error.cpp core/log.cpp)
