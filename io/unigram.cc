// Unigram model: byte trie over the pieces, Viterbi over the lattice, fused unknowns, byte
// fallback. See unigram.h for the HF behaviour reproduced.
#include "io/unigram.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

#include "core/utf8.h"

namespace strata {
namespace {

// HF tokenizers' K_UNK_PENALTY: an unknown character scores this much below the worst piece.
constexpr double kUnkPenalty = 10.0;

// Byte length of the character that starts at s[i]: the validated UTF-8 sequence, or 1 for a
// byte that does not start one (so that invalid input still advances byte by byte).
size_t CharLen(std::string_view s, size_t i) { return DecodeUtf8At(s, i).len; }

}  // namespace

StatusOr<UnigramModel> UnigramModel::Build(std::vector<Piece> vocab, int32_t unk_id,
                                           bool byte_fallback) {
  if (vocab.empty()) return InvalidArgument("Unigram model: the vocabulary is empty");
  if (vocab.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return InvalidArgument("Unigram model: " + std::to_string(vocab.size()) +
                           " pieces are more than int32 ids can address");
  }
  const int32_t n = static_cast<int32_t>(vocab.size());
  if (unk_id < -1 || unk_id >= n) {
    return InvalidArgument("Unigram model: unk_id " + std::to_string(unk_id) +
                           " is not a piece id (vocabulary of " + std::to_string(n) + ")");
  }
  UnigramModel m;
  m.unk_id_ = unk_id;
  m.byte_fallback_ = byte_fallback;
  m.node_token_.push_back(-1);  // root
  double min_score = std::numeric_limits<double>::infinity();
  m.token_to_id_.reserve(vocab.size() * 2);
  for (int32_t id = 0; id < n; ++id) {
    const Piece& p = vocab[id];
    if (p.text.empty()) {
      return InvalidArgument("Unigram model: piece " + std::to_string(id) + " has empty text");
    }
    if (!std::isfinite(p.score)) {
      return InvalidArgument("Unigram model: piece " + std::to_string(id) + " has score " +
                             std::to_string(p.score) + " (not finite)");
    }
    min_score = std::min(min_score, p.score);
    m.token_to_id_[p.text] = id;  // a duplicate text: the last id wins, as in HF
    int32_t node = 0;
    for (const char ch : p.text) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(ch);
      auto [it, inserted] = m.edges_.try_emplace(key, static_cast<int32_t>(m.node_token_.size()));
      if (inserted) m.node_token_.push_back(-1);
      node = it->second;
    }
    m.node_token_[node] = id;  // equal texts end at one node: the last id, as token_to_id_
  }
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    const auto it = m.token_to_id_.find(buf);
    m.byte_ids_[b] = it == m.token_to_id_.end() ? -1 : it->second;
  }
  m.unk_score_ = min_score - kUnkPenalty;
  m.pieces_ = std::move(vocab);
  return m;
}

int32_t UnigramModel::Child(int32_t node, uint8_t byte) const {
  const auto it = edges_.find((static_cast<uint64_t>(node) << 8) | byte);
  return it == edges_.end() ? -1 : it->second;
}

std::vector<int32_t> UnigramModel::Encode(std::string_view s) const {
  std::vector<int32_t> out;
  if (s.empty()) return out;
  const size_t size = s.size();
  // best[p]: the best path covering s[0, p): its score, where its last piece starts and which
  // piece it is (kUnkEdge for an unknown-character edge).
  constexpr int32_t kUnkEdge = -2;
  struct Best {
    double score = 0;
    int64_t starts_at = -1;  // -1: not reached yet
    int32_t id = -1;
  };
  std::vector<Best> best(size + 1);
  best[0].starts_at = 0;
  auto offer = [&](size_t end, size_t start, double score, int32_t id) {
    Best& b = best[end];
    // Strictly better only: the first candidate (earliest start) wins a tie, as in HF.
    if (b.starts_at < 0 || score > b.score) b = {score, static_cast<int64_t>(start), id};
  };
  for (size_t start = 0; start < size;) {
    const double here = best[start].score;
    const size_t char_len = CharLen(s, start);
    bool has_single_char = false;
    int32_t node = 0;
    for (size_t pos = start; pos < size; ++pos) {
      node = Child(node, static_cast<uint8_t>(s[pos]));
      if (node < 0) break;
      const int32_t id = node_token_[node];
      if (id < 0) continue;
      offer(pos + 1, start, here + pieces_[id].score, id);
      if (pos + 1 - start == char_len) has_single_char = true;
    }
    if (!has_single_char) offer(start + char_len, start, here + unk_score_, kUnkEdge);
    start += char_len;
  }

  // Back-trace into pieces (end-first), fusing runs of unknown edges (and of the unk piece
  // itself, which HF treats alike since it compares ids).
  struct Span {
    size_t begin, end;
    bool unk;
  };
  std::vector<Span> spans;
  for (size_t end = size; end > 0;) {
    const Best& b = best[end];
    const size_t begin = static_cast<size_t>(b.starts_at);
    const bool unk = b.id == kUnkEdge || (unk_id_ >= 0 && b.id == unk_id_);
    if (unk && !spans.empty() && spans.back().unk) {
      spans.back().begin = begin;
    } else {
      spans.push_back({begin, end, unk});
    }
    end = begin;
  }
  for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
    const std::string_view text = s.substr(it->begin, it->end - it->begin);
    const auto found = token_to_id_.find(std::string(text));
    if (found != token_to_id_.end()) {
      out.push_back(found->second);
      continue;
    }
    bool all_bytes = byte_fallback_;
    for (size_t k = 0; all_bytes && k < text.size(); ++k) {
      all_bytes = byte_ids_[static_cast<uint8_t>(text[k])] >= 0;
    }
    if (all_bytes) {
      for (const char c : text) out.push_back(byte_ids_[static_cast<uint8_t>(c)]);
    } else if (unk_id_ >= 0) {
      out.push_back(unk_id_);
    }
  }
  return out;
}

}  // namespace strata
