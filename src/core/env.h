// DELTASERVE_* environment knobs: one registry, one parser, declared ranges.
//
// Integer knobs: an out-of-range value is clamped into [min, max] with a warning; a value that is not a
// plain base-10 integer ("2x", "", "1e3", " 3") stops start-up with an error naming the knob, the value and
// the accepted range. Choice knobs accept exactly one of their listed words.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ds {

struct IntKnob {
  const char* name;
  int64_t default_value;
  int64_t min;
  int64_t max;
  const char* help;
};

struct ChoiceKnob {
  const char* name;
  const char* default_value;
  std::vector<std::string> choices;
  const char* help;
};

// Parses `value` (nullptr = unset -> default) for `knob`. Throws ds::Error on a non-integer.
int64_t parse_int_knob(const IntKnob& knob, const char* value);
std::string parse_choice_knob(const ChoiceKnob& knob, const char* value);
// Reads the knob from the process environment.
int64_t get_knob(const IntKnob& knob);
std::string get_knob(const ChoiceKnob& knob);

// Every knob the engine reads, declared once here so `serve --help` can list them.
namespace knobs {
extern const IntKnob kFp8KdaProj;                    // DELTASERVE_FP8_KDA_PROJ
extern const IntKnob kForceSeparatedRouting;         // DELTASERVE_FORCE_SEPARATED_ROUTING
extern const IntKnob kFusedFinalizeArNormMaxTokens;  // DELTASERVE_FUSED_FINALIZE_AR_NORM_MAX_TOKENS
extern const IntKnob kHfBiasedRouting;               // DELTASERVE_HF_BIASED_ROUTING
extern const IntKnob kFp8DecodeGemv;                 // DELTASERVE_FP8_DECODE_GEMV
extern const IntKnob kMoeGemvDecode;                 // DELTASERVE_MOE_GEMV_DECODE
extern const IntKnob kMoeGemvTokens;                 // DELTASERVE_MOE_GEMV_TOKENS
extern const IntKnob kMoeClusterRoute;               // DELTASERVE_MOE_CLUSTER_ROUTE
extern const IntKnob kMoeFusedNorm;                  // DELTASERVE_MOE_FUSED_NORM
extern const IntKnob kFusedInputNorm;                // DELTASERVE_FUSED_INPUT_NORM
extern const IntKnob kFusedPostNorm;                 // DELTASERVE_FUSED_POST_NORM
extern const IntKnob kMoeFusedRoute;                 // DELTASERVE_MOE_FUSED_ROUTE
extern const IntKnob kFp8LmHead;                     // DELTASERVE_FP8_LM_HEAD
extern const IntKnob kMoeGemvUpCols;                 // DELTASERVE_MOE_GEMV_UP_COLS
extern const IntKnob kMoeGemvDownRows;               // DELTASERVE_MOE_GEMV_DOWN_ROWS
extern const IntKnob kMoeDownPersistent;             // DELTASERVE_MOE_DOWN_PERSISTENT
extern const IntKnob kMoeDownPreload;                // DELTASERVE_MOE_DOWN_PRELOAD
extern const IntKnob kMoeFp8PrefillTile;             // DELTASERVE_MOE_FP8_PREFILL_TILE
extern const IntKnob kMoeFp8DecodeWgmma;             // DELTASERVE_MOE_FP8_DECODE_WGMMA
extern const IntKnob kMoeStreamTiles;                // DELTASERVE_MOE_STREAM_TILES
extern const IntKnob kMlaFusedCacheWrite;            // DELTASERVE_MLA_FUSED_CACHE_WRITE
extern const IntKnob kMoePreNorm;                    // DELTASERVE_MOE_PRE_NORM
extern const IntKnob kPdl;                           // DELTASERVE_PDL
extern const ChoiceKnob kKdaLayout;                  // DELTASERVE_KDA_LAYOUT
const std::vector<const IntKnob*>& int_knobs();
const std::vector<const ChoiceKnob*>& choice_knobs();
// Reads every knob once (start-up validation: a bad value fails here, not mid-run).
void validate_all();
// Help text listing every knob with its range and default.
std::string help_text();
}  // namespace knobs

}  // namespace ds
