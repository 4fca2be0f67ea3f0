// Test support for eval/ tests (header-only, not used by the library): tiny models on disk, a
// hand-built retrieval model for the integrity gates, the cache-destroying leakage-floor policy
// (registered only through a local factory, never in kv/registry), and an XML well-formedness
// check.
#pragma once

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "eval/runner.h"
#include "io/gguf.h"
#include "io/hf.h"
#include "kv/policy.h"
#include "kv/registry.h"
#include "model/model.h"
#include "model/synth.h"

namespace strata::eval::testing {

inline std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("strata_eval_" + std::to_string(getpid()) + "_" + name))
      .string();
}

// The random-weight tiny llama with a SentencePiece-style tokenizer (vocab 512).
inline StatusOr<std::unique_ptr<Model>> TinyTextModel() {
  SynthOptions o;
  RETURN_IF_ERROR(o.ApplyPreset("tiny"));
  o.seed = 7;
  const std::string path = TempPath("tiny.gguf");
  RETURN_IF_ERROR(SynthGguf(o, path));
  auto m = Model::Load(path);
  std::filesystem::remove(path);
  return m;
}

// A 1-layer llama whose weights are set by hand so that it solves the kv-tokens needle by one
// content-addressed attention head (vocab 512, the synth minimum being 260: 0 BOS, 1 KEY, 2..17
// slot 0, 18..33 slot 1, 50+ characters). Head 0: a KEY query matches slot-0 keys (q/k dim 31) and
// a slot-0 query matches slot-1 keys (dim 30); the value is the one-hot identity of the value
// token, written by the output projection into residual dims [0, 32), which the unembedding reads
// as logits of ids 2..33. Every other weight is zero (or a norm of ones), and RoPE base 1e30 leaves
// dims 30/31 unrotated. With the needle in the cache the answer NLL is ~1e-6; without it, log(512)
// per token.
inline StatusOr<std::unique_ptr<Model>> RetrievalModel() {
  constexpr int kV = 512, kD = 128, kHeads = 4, kKv = 2, kHd = 32, kFf = 32;
  SynthOptions o;
  o.arch = Arch::kLlama;
  o.d_model = kD;
  o.n_layers = 1;
  o.n_heads = kHeads;
  o.n_kv_heads = kKv;
  o.head_dim = kHd;
  o.d_ff = kFf;
  o.vocab = kV;
  o.rope_base = 1e30f;
  o.dtype = DType::kF32;
  const std::string dir = TempPath("retrieval_hf");
  RETURN_IF_ERROR(SynthHf(o, dir));
  HfConvertOptions co;
  co.out_dtype = DType::kF32;
  auto conv = ConvertHfDirectory(dir, co);
  std::filesystem::remove_all(dir);
  if (!conv.ok()) return conv.status();
  ASSIGN_OR_RETURN(auto src, GgufFile::FromBuffer(conv->ToBytes(), "retrieval"));

  const float a = 1.2f;  // q/k detector weight: score = a^2 * 128 / sqrt(32) ~ 32.6
  std::map<std::string, std::vector<float>> w;
  auto mat = [&](const std::string& name, int rows, int cols) -> std::vector<float>& {
    return w[name] = std::vector<float>(static_cast<size_t>(rows) * cols, 0.f);
  };
  auto& emb = mat("token_embd.weight", kV, kD);
  for (int t = 0; t < kV; ++t) {
    int dim;
    if (t == 0) {
      dim = 126;
    } else if (t == 1) {
      dim = 64;
    } else if (t < 34) {
      dim = 32 + (t - 2);
    } else {
      dim = 65 + (t % 60);
    }
    emb[static_cast<size_t>(t) * kD + dim] = 1.f;
  }
  w["output_norm.weight"] = std::vector<float>(kD, 1.f);
  w["blk.0.attn_norm.weight"] = std::vector<float>(kD, 1.f);
  w["blk.0.ffn_norm.weight"] = std::vector<float>(kD, 1.f);
  auto& wq = mat("blk.0.attn_q.weight", kHeads * kHd, kD);
  wq[31 * kD + 64] = a;                                   // KEY -> detector A
  for (int j = 0; j < 16; ++j) wq[30 * kD + 32 + j] = a;  // slot 0 -> detector B
  auto& wk = mat("blk.0.attn_k.weight", kKv * kHd, kD);
  for (int j = 0; j < 16; ++j) wk[31 * kD + 32 + j] = a;  // slot-0 keys answer A
  for (int j = 0; j < 16; ++j) wk[30 * kD + 48 + j] = a;  // slot-1 keys answer B
  auto& wv = mat("blk.0.attn_v.weight", kKv * kHd, kD);
  for (int j = 0; j < 32; ++j) wv[j * kD + 32 + j] = 1.f;  // value identity
  auto& wo = mat("blk.0.attn_output.weight", kD, kHeads * kHd);
  for (int j = 0; j < 32; ++j) wo[j * (kHeads * kHd) + j] = 1.f;  // head 0 only
  mat("blk.0.ffn_gate.weight", kFf, kD);
  mat("blk.0.ffn_up.weight", kFf, kD);
  mat("blk.0.ffn_down.weight", kD, kFf);
  auto& out = mat("output.weight", kV, kD);
  for (int j = 0; j < 32; ++j) out[(j + 2) * kD + j] = 1.8f;

  GgufWriter dst;
  for (const auto& [k, v] : src->metadata()) dst.Set(k, v);
  for (const GgufTensorInfo& t : src->tensors()) {
    auto it = w.find(t.name);
    if (it != w.end()) {
      int64_t n = 1;
      for (int64_t s : t.shape) n *= s;
      if (n != static_cast<int64_t>(it->second.size())) {
        return Internal("retrieval model: tensor " + t.name + " has " + std::to_string(n) +
                        " values, expected " + std::to_string(it->second.size()));
      }
      RETURN_IF_ERROR(dst.AddTensorF32(t.name, DType::kF32, t.shape, it->second.data()));
      w.erase(it);
    } else {
      ASSIGN_OR_RETURN(TensorView v, src->Tensor(t.name));
      RETURN_IF_ERROR(dst.AddTensor(t.name, t.dtype, t.shape, v.data, t.n_bytes));
    }
  }
  if (!w.empty()) return Internal("retrieval model: no tensor named " + w.begin()->first);
  ASSIGN_OR_RETURN(auto file, GgufFile::FromBuffer(dst.ToBytes(), "retrieval"));
  return Model::FromGguf(std::move(file));
}

// The leakage floor: every query reads only its own row, as if the cache had been destroyed.
class DestroyPolicy final : public Policy {
 public:
  std::string name() const override { return "destroy"; }
  Status Bind(const std::vector<LayerGeometry>&) override { return OkStatus(); }
  Status Read(int layer, const LayerStore& store, const float* q, int64_t limit, ThreadPool* pool,
              SoftmaxStates* st, ReadStats* stats) override {
    const int64_t row = limit - 1;
    ReadRows(store, q, &row, 1, pool, st, stats);
    return OkStatus();
  }
};

// The registry plus "destroy", for tests only.
inline PolicyFactory FactoryWithDestroy() {
  return [](const PolicySpec& spec) -> StatusOr<std::unique_ptr<Policy>> {
    if (spec.name == "destroy") return std::unique_ptr<Policy>(new DestroyPolicy());
    return MakePolicy(spec);
  };
}

// Minimal XML well-formedness: an optional <?xml ...?> declaration, comments, one root element,
// balanced and properly nested tags, attributes as name="value" or name='value' without a raw
// '<' in the value, and text/attribute '&' only as an entity (&amp; &lt; &gt; &quot; &apos;
// &#N; &#xH;). Returns "" when well formed, else what is wrong and where.
inline std::string XmlWellFormedError(const std::string& s) {
  size_t i = 0;
  std::vector<std::string> stack;
  int roots = 0;
  auto at = [&](size_t p) { return " at byte " + std::to_string(p); };
  auto is_name = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':' || c == '-' ||
           c == '.';
  };
  auto check_entities = [&](size_t b, size_t e) -> std::string {
    for (size_t p = b; p < e; ++p) {
      if (s[p] != '&') continue;
      const size_t semi = s.find(';', p);
      if (semi == std::string::npos || semi > e) return "bare '&'" + at(p);
      const std::string ent = s.substr(p + 1, semi - p - 1);
      const bool ok = ent == "amp" || ent == "lt" || ent == "gt" || ent == "quot" ||
                      ent == "apos" || (ent.size() > 1 && ent[0] == '#');
      if (!ok) return "unknown entity &" + ent + ";" + at(p);
    }
    return "";
  };
  while (i < s.size()) {
    if (s[i] != '<') {
      const size_t next = s.find('<', i);
      const size_t e = next == std::string::npos ? s.size() : next;
      if (stack.empty()) {
        for (size_t p = i; p < e; ++p) {
          if (!std::isspace(static_cast<unsigned char>(s[p])))
            return "text outside the root" + at(p);
        }
      }
      if (auto err = check_entities(i, e); !err.empty()) return err;
      if (s.find('>', i) < e) return "raw '>' in text" + at(s.find('>', i));
      i = e;
      continue;
    }
    if (s.compare(i, 5, "<?xml") == 0) {
      if (i != 0) return "XML declaration not at the start" + at(i);
      const size_t e = s.find("?>", i);
      if (e == std::string::npos) return "unterminated declaration";
      i = e + 2;
      continue;
    }
    if (s.compare(i, 4, "<!--") == 0) {
      const size_t e = s.find("-->", i);
      if (e == std::string::npos) return "unterminated comment" + at(i);
      i = e + 3;
      continue;
    }
    const bool closing = i + 1 < s.size() && s[i + 1] == '/';
    size_t p = i + (closing ? 2 : 1);
    const size_t name_b = p;
    while (p < s.size() && is_name(s[p])) ++p;
    if (p == name_b) return "tag without a name" + at(i);
    const std::string name = s.substr(name_b, p - name_b);
    if (closing) {
      while (p < s.size() && std::isspace(static_cast<unsigned char>(s[p]))) ++p;
      if (p >= s.size() || s[p] != '>') return "bad closing tag </" + name + at(i);
      if (stack.empty() || stack.back() != name) {
        return "closing </" + name + "> does not match <" + (stack.empty() ? "" : stack.back()) +
               ">" + at(i);
      }
      stack.pop_back();
      i = p + 1;
      continue;
    }
    // Attributes.
    bool self_closing = false;
    std::vector<std::string> seen;
    while (true) {
      while (p < s.size() && std::isspace(static_cast<unsigned char>(s[p]))) ++p;
      if (p >= s.size()) return "unterminated tag <" + name + at(i);
      if (s[p] == '>') break;
      if (s[p] == '/') {
        if (p + 1 >= s.size() || s[p + 1] != '>') return "stray '/' in <" + name + at(p);
        self_closing = true;
        ++p;
        break;
      }
      const size_t ab = p;
      while (p < s.size() && is_name(s[p])) ++p;
      if (p == ab) return "bad attribute in <" + name + at(p);
      const std::string attr = s.substr(ab, p - ab);
      for (const auto& x : seen) {
        if (x == attr) return "duplicate attribute " + attr + at(ab);
      }
      seen.push_back(attr);
      if (p >= s.size() || s[p] != '=') return "attribute " + attr + " without a value" + at(p);
      ++p;
      if (p >= s.size() || (s[p] != '"' && s[p] != '\'')) {
        return "unquoted attribute " + attr + at(p);
      }
      const char quote = s[p];
      const size_t vb = p + 1;
      const size_t ve = s.find(quote, vb);
      if (ve == std::string::npos) return "unterminated attribute " + attr + at(vb);
      if (s.find('<', vb) < ve) return "raw '<' in attribute " + attr + at(vb);
      if (auto err = check_entities(vb, ve); !err.empty()) return err;
      p = ve + 1;
    }
    if (stack.empty()) {
      if (++roots > 1) return "second root element <" + name + ">" + at(i);
    }
    if (!self_closing) stack.push_back(name);
    i = p + 1;
  }
  if (!stack.empty()) return "unclosed <" + stack.back() + ">";
  if (roots != 1) return "no root element";
  return "";
}

}  // namespace strata::eval::testing
