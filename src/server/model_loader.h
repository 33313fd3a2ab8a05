// Loads what `serve` needs: the model (embedded or a folder) with a tokenizer of any supported kind.
#pragma once

#include <string>

#include "runtime/model_files.h"

namespace ds::server {

// ds::load_model, except that a folder's tokenizer comes from tok::load_model_tokenizer, which also reads
// tiktoken.model (ds::load_tokenizer refuses it: the tiktoken loader lives in this branch's tokenizer code).
LoadedModel load_serving_model(const std::string& dir);

}  // namespace ds::server
