# config.json parsing and validation (model/config.cpp + presets.cpp need only core and nlohmann_json).
ds_add_fuzzer(model_config ${CMAKE_CURRENT_SOURCE_DIR}/model_config_fuzz.cpp
              model/config.cpp core/dtype.cpp core/error.cpp core/log.cpp)
