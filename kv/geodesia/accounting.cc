// Geodesia-KV rate accounting (see accounting.h).
#include "kv/geodesia/accounting.h"

#include "core/check.h"

namespace strata::geodesia {

int64_t LevelBlockBits(int level, int head_dim, int group_size) {
  const int64_t P = kBlockTokens, D = head_dim, g = group_size;
  switch (level) {
    case 16: return 2 * P * D * 16;
    case 1: return 2 * D * 16;
    case 8:
    case 4:
    case 2: return 2 * level * P * D + std::max<int64_t>(1, P / g) * D * 32 +
                   P * std::max<int64_t>(1, D / g) * 32;
    default: STRATA_CHECK_MSG(false, "level %d", level);
  }
  return 0;
}

double LevelBitsPerValue(int level, int head_dim, int group_size) {
  return static_cast<double>(LevelBlockBits(level, head_dim, group_size)) /
         (2.0 * kBlockTokens * head_dim);
}

int64_t ResidentBitsClosedForm(const std::array<int64_t, kNumLevels>& level_blocks,
                               int64_t n_residual, int head_dim, int group_size, bool boxes) {
  int64_t bits = 0, nb = 0;
  for (int i = 0; i < kNumLevels; ++i) {
    bits += level_blocks[i] * LevelBlockBits(kLevels[i], head_dim, group_size);
    nb += level_blocks[i];
  }
  bits += 32 * int64_t{head_dim} * n_residual;
  if (boxes) bits += 32 * int64_t{head_dim} * nb;
  return bits;
}

int64_t ReadBitsClosedForm(const std::array<int64_t, kNumLevels>& read_level_blocks,
                           int64_t read_residual, int64_t n_blocks, int head_dim, int group_size,
                           bool boxes) {
  int64_t bits = 0;
  for (int i = 0; i < kNumLevels; ++i) {
    bits += read_level_blocks[i] * LevelBlockBits(kLevels[i], head_dim, group_size);
  }
  bits += 32 * int64_t{head_dim} * read_residual;
  if (boxes) bits += 32 * int64_t{head_dim} * n_blocks;
  return bits;
}

double ResidentBitsPerValue(const GradedLayer& layer) {
  if (layer.n_tokens() == 0) return 0;
  return 8.0 * layer.resident_bytes().total() /
         (2.0 * layer.n_tokens() * layer.head_dim() * layer.n_kv_heads());
}

int64_t ResidentBitsClosedForm(const GradedLayer& layer) {
  int64_t bits = 0;
  for (int h = 0; h < layer.n_kv_heads(); ++h) {
    bits += ResidentBitsClosedForm(layer.level_histogram(h), layer.n_residual(h),
                                   layer.head_dim(), layer.config().group_size,
                                   layer.has_boxes());
  }
  return bits;
}

}  // namespace strata::geodesia
