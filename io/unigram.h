// Unigram language-model tokenizer (SentencePiece "unigram" as HF tokenizers runs it): the
// highest-scoring segmentation of a normalized piece by Viterbi over the lattice of vocabulary
// pieces, with unknown characters fused and optionally spelled as <0xNN> byte pieces.
//
// Behaviour follows tokenizers' models/unigram (encode_optimized + tokenize):
// - Every vocabulary piece is a lattice edge scored by its log probability; the path with the
//   highest total wins. Ties keep the path whose last piece starts earliest (the first candidate
//   found), as HF does.
// - A character that starts no single-character piece gets an "unknown" edge scored
//   min(score) - 10 (HF's K_UNK_PENALTY). Consecutive unknown edges are fused into one piece
//   (fuse_unk, always on in HF).
// - An output piece that is not in the vocabulary (a fused unknown run) becomes the <0xNN>
//   pieces of its bytes when byte_fallback is set and every such piece exists, else unk_id.
// - Characters are UTF-8 code points; an invalid byte counts as a one-byte character (HF never
//   sees one: its input is a Rust str).
// - unk_id = -1 (tokenizer.json "unk_id": null): HF fails the whole encode at the first unknown
//   character; here such a piece is spelled in byte pieces when possible and otherwise dropped.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace strata {

class UnigramModel {
 public:
  struct Piece {
    std::string text;
    double score;
  };

  // Errors: empty vocabulary, unk_id outside [-1, size), an empty piece text, a non-finite
  // score. Duplicate texts are allowed; the last id wins (HF's token_to_ids map).
  static StatusOr<UnigramModel> Build(std::vector<Piece> vocab, int32_t unk_id,
                                      bool byte_fallback);

  // The ids of one normalized, pre-tokenized piece ("" -> none).
  std::vector<int32_t> Encode(std::string_view normalized_piece) const;

  int32_t size() const { return static_cast<int32_t>(pieces_.size()); }
  int32_t unk_id() const { return unk_id_; }
  bool byte_fallback() const { return byte_fallback_; }
  const Piece& piece(int32_t id) const { return pieces_[id]; }
  // min(score) - 10: the score of an unknown-character edge.
  double unk_score() const { return unk_score_; }

 private:
  UnigramModel() = default;
  // Byte trie over the piece texts: node 0 is the root; edges are (node << 8 | byte) -> child.
  int32_t Child(int32_t node, uint8_t byte) const;

  std::vector<Piece> pieces_;
  std::vector<int32_t> node_token_;  // per trie node: the id ending there, or -1
  std::unordered_map<uint64_t, int32_t> edges_;
  std::unordered_map<std::string, int32_t> token_to_id_;
  int32_t byte_ids_[256];  // id of "<0xNN>", or -1
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false;
  double unk_score_ = 0;
};

}  // namespace strata
