// Registry makers of the baseline policies (streaming, h2o, h2o-recent, snapkv, quest, kivi2,
// kivi4, random). How each spends the budget: kv/baselines/{eviction,quest,kivi}.h and
// docs/baselines.md.
#pragma once

#include "kv/baselines/eviction.h"
#include "kv/baselines/kivi.h"
#include "kv/baselines/quest.h"
