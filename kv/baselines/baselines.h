// Registry makers of the baseline policies (streaming, h2o, h2o-recent, snapkv, quest, kivi2,
// kivi4, q8_0, q4_0, turboquant,
// coldfp4, random). How each spends the budget: kv/baselines/{eviction,quest,kivi,
// llamacpp_kv,turboquant,coldfp4}.h and docs/baselines.md.
#pragma once

#include "kv/baselines/coldfp4.h"
#include "kv/baselines/eviction.h"
#include "kv/baselines/kivi.h"
#include "kv/baselines/llamacpp_kv.h"
#include "kv/baselines/quest.h"
#include "kv/baselines/turboquant.h"
