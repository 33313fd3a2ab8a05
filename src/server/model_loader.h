// Loads what `serve` needs: the model (embedded or a folder) with a tokenizer of any supported kind.
#pragma once

#include <string>

#include "runtime/model_files.h"

namespace ds::server {

// ds::load_model, except that a folder's tokenizer comes from tok::load_model_tokenizer, which also reads
// tiktoken.model (ds::load_tokenizer refuses it: the tiktoken loader lives in this branch's tokenizer code).
LoadedModel load_serving_model(const std::string& dir);
// A preset's config (its first `layers` layers, 0 = all) with no weights and the byte tokenizer: `serve
// --random-weights`, which builds the weights itself (make_random_engine) so a full-size server needs no
// checkpoint. Clients send token-id prompts or bytes; the text is not meaningful.
LoadedModel random_serving_model(const std::string& preset, int layers);

}  // namespace ds::server
