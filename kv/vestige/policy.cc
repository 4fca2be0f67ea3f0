// § numbers cite docs/reference/vestigekv.md (the reference behaviour).
#include "kv/vestige/policy.h"

#include "kv/vestige/capacity.h"

#include <functional>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "core/check.h"

namespace strata {
namespace {

std::atomic<int64_t> g_instances{0};

// The default tier 2: one RecallTier per MLA layer, driven as recall.h describes (same-step
// query). Any tier error is sticky and turns every later scan of that layer into a dense fallback
// (exact), never into a silent miss.
class TierHook final : public VestigeRecallHook {
 public:
  // A copy of every tier's state, without the policy reader (the file placement, which installs
  // one, is not forked).
  TierHook(const TierHook& o)
      : opt_(o.opt_),
        ok_(o.ok_),
        max1_(o.max1_),
        entropy_(o.entropy_),
        error_(o.error_),
        read_error_(o.read_error_) {
    tiers_.reserve(o.tiers_.size());
    for (const RecallTier& t : o.tiers_) tiers_.push_back(t.Clone());
    ReserveAsIn(&max1_, o.max1_);
    ReserveAsIn(&entropy_, o.entropy_);
  }
  StatusOr<std::unique_ptr<VestigeRecallHook>> Clone() const override {
    if (policy_reader_) {
      return Unimplemented("the recall tier of an archive file cannot be forked");
    }
    return std::unique_ptr<VestigeRecallHook>(new TierHook(*this));
  }
  TierHook(const RecallOptions& opt, const std::vector<LayerGeometry>& layers) : opt_(opt) {
    tiers_.resize(layers.size());
    ok_.assign(layers.size(), 0);
    read_error_.resize(layers.size());
    for (size_t l = 0; l < layers.size(); ++l) {
      if (layers[l].kind != AttnKind::kMla) continue;
      Status s = tiers_[l].Configure(layers[l], opt);
      if (!s.ok()) {
        Note(s.WithContext(LayerName(layers[l], l)));
        continue;
      }
      ok_[l] = 1;
    }
  }

  int64_t observation_queries(int64_t prompt_len) const override {
    // Prompt queries [T/2, T) (§3.4); RecallTier strides them down to calib-queries.
    return opt_.calibration == RecallCalibration::kPrefix ? prompt_len - prompt_len / 2 : 0;
  }
  int64_t observation_stride(int64_t n_observed) const override {
    return RecallTier::PrefixObservationStride(n_observed, opt_.prefix_max_queries);
  }
  void Observe(int layer, const LayerStore& store, const PrefillObservation& obs) override {
    if (ok_[layer]) tiers_[layer].ObserveQuery(obs.query_pos, obs.q);
  }
  // Where row content comes from once the policy has released a page to its archive file.
  using PolicyReader = std::function<Status(int, const LayerStore&, int64_t, uint16_t*)>;
  void SetPolicyReader(PolicyReader r) { policy_reader_ = std::move(r); }

  void OnSelection(int layer, const LayerStore& store, int64_t n_closed,
                   const std::vector<int64_t>& archived, ThreadPool* pool) override {
    if (!ok_[layer]) return;
    if (policy_reader_) {
      const LayerStore* sp = &store;
      tiers_[layer].SetRowReader([this, layer, sp](int64_t u, uint16_t* scratch) {
        if (sp->page_resident(0, u / LayerStore::kPageRows)) return sp->key_row(0, u);
        Status s = policy_reader_(layer, *sp, u, scratch);
        if (!s.ok()) {
          // Never scored as garbage: the layer is failed by the caller and reads densely from
          // then on. Readers run on several threads at once.
          std::lock_guard<std::mutex> lock(read_error_mu_);
          if (read_error_[layer].ok()) read_error_[layer] = s;
          std::fill(scratch, scratch + sp->geometry().k_dim, uint16_t{0});
        }
        return static_cast<const uint16_t*>(scratch);
      });
    }
    Status s = tiers_[layer].IndexClosedRows(store, n_closed, pool);
    if (s.ok() && !read_error_[layer].ok()) s = read_error_[layer];
    if (!s.ok()) {
      Fail(layer, s);
      return;
    }
    tiers_[layer].SetArchive(archived.data(), static_cast<int64_t>(archived.size()));
  }
  void OnCompress(int layer, const LayerStore& store, ThreadPool* pool) override {
    if (!ok_[layer] || opt_.calibration != RecallCalibration::kPrefix) return;
    Status s = tiers_[layer].CalibratePrefix(store, pool);
    if (s.ok() && !read_error_[layer].ok()) s = read_error_[layer];
    if (!s.ok()) Fail(layer, s);
  }
  void Fetch(int layer, const LayerStore& store, const float* q, int64_t limit,
             const std::vector<int64_t>& attended, const SoftmaxStates& attended_states,
             const std::vector<int64_t>& archived, ThreadPool* pool, std::vector<int64_t>* fetched,
             bool* fallback) override {
    if (!ok_[layer]) {
      *fallback = true;
      return;
    }
    RecallTier& t = tiers_[layer];
    const int H = attended_states.n_heads;
    max1_.assign(attended_states.m, attended_states.m + H);
    const float* entropy = nullptr;
    if (t.needs_entropy()) {
      entropy_.resize(H);
      // Through the tier's row source: with the file archive the kept rows of released pages
      // live in the policy's restored buffer, not in the store.
      t.AttendedStats(store, q, attended.data(), static_cast<int64_t>(attended.size()), pool,
                      max1_.data(), entropy_.data());
      entropy = entropy_.data();
      if (!read_error_[layer].ok()) {
        Fail(layer, read_error_[layer]);
        *fallback = true;
        return;
      }
    }
    const RecallScan r = t.Scan(store, q, limit, max1_.data(), entropy, pool);
    if (!read_error_[layer].ok()) {  // a decode-mode calibration in Scan met an unreadable row
      Fail(layer, read_error_[layer]);
      *fallback = true;
      return;
    }
    if (r.fallback) {
      *fallback = true;
      return;
    }
    fetched->insert(fetched->end(), r.rows, r.rows + r.n);
  }
  int64_t ScanBytesPerArchivedRow(int layer) const override {
    return tiers_[layer].configured() ? tiers_[layer].scan_bytes_per_row() : 0;
  }
  int64_t ResidentBytes(int layer) const override {
    return tiers_[layer].configured() ? tiers_[layer].ResidentBytes() : 0;
  }
  Status status() const override { return error_; }
  const RecallTier* tier(int layer) const { return ok_[layer] ? &tiers_[layer] : nullptr; }

 private:
  void Note(const Status& s) {
    if (error_.ok()) error_ = s;
  }
  void Fail(int layer, const Status& s) {
    Note(s.WithContext("recall tier of layer " + std::to_string(layer)));
    ok_[layer] = 0;
  }
  RecallOptions opt_;
  std::vector<RecallTier> tiers_;
  std::vector<uint8_t> ok_;
  std::vector<float> max1_, entropy_;
  Status error_;
  // Per layer: the first row the policy reader could not serve (written under the mutex: readers
  // run on several threads).
  std::vector<Status> read_error_;
  std::mutex read_error_mu_;
  PolicyReader policy_reader_;
};

}  // namespace

std::string VestigeConfig::ToString() const {
  char buf[512];
  std::snprintf(
      buf, sizeof(buf),
      "%s: ratio %g, block %lld, kappa %d (cutoff period %g rows), sinks %d, archive %s, "
      "recall %s (rank %d, capacity %lld, calibration %s)",
      selector.full_row ? "fullrow" : "vestige", ratio(), static_cast<long long>(selector.block),
      selector.kappa, cutoff_period(), selector.sinks,
      archive == VestigeArchivePlacement::kRam ? "ram" : ("file:" + archive_dir).c_str(),
      recall ? "on" : "off", recall_options.rank, static_cast<long long>(recall_options.capacity),
      std::string(RecallCalibrationName(recall_options.calibration)).c_str());
  return buf;
}

PolicySettings VestigeSettings(bool full_row) {
  const VestigeConfig c;
  PolicySettings p;
  p.policy = full_row ? "fullrow" : "vestige";
  p.budget = "ratio";
  p.settings = {
      SettingDecl::Real("ratio", 32,
                        "row budget R: keep 1/R of the closed rows besides sinks and the tail")
          .Min(1)
          .Shared(),
      SettingDecl::Int("block", c.selector.block, "rows per closed block (the compression unit)")
          .Min(LayerStore::kPageRows)
          .Constraint("a multiple of 64")
          .Shared(),
      SettingDecl::Int("kappa", c.selector.kappa, "low-pass bins kept per block")
          .Min(1)
          .Constraint("< block/2")
          .Shared(),
      SettingDecl::Int("sinks", c.selector.sinks, "always-kept first rows").Min(0).Constraint(
          "<= block").Shared(),
      SettingDecl::String("archive", "ram", "ram | file:DIR",
                          "where archived rows live: in RAM, or in a file in DIR")
          .Shared(),
      SettingDecl::Bool("recall", c.recall, "the recall tier (tier 2) that fetches archived rows")
          .Shared(),
  };
  for (SettingDecl& d : RecallSettingDecls()) p.settings.push_back(std::move(d));
  return p;
}

StatusOr<VestigeConfig> VestigeConfig::FromSpec(const PolicySpec& spec, bool full_row) {
  const PolicySettings decl = VestigeSettings(full_row);
  ASSIGN_OR_RETURN(const ResolvedSettings s, ResolveSettings(decl, spec.settings));
  VestigeConfig c;
  c.selector.full_row = full_row;
  ASSIGN_OR_RETURN(c.selector.ratio, VestigeRatio::Parse(s.text("ratio")));
  const int64_t block = s.Int("block");
  const int64_t kappa = s.Int("kappa");
  const int64_t sinks = s.Int("sinks");
  if (block < LayerStore::kPageRows || block % LayerStore::kPageRows != 0) {
    return InvalidArgument("--block = " + std::to_string(block) +
                           " must be a positive multiple of the 64-row page");
  }
  if (kappa < 1) return InvalidArgument("--kappa = " + std::to_string(kappa) + " must be >= 1");
  if (kappa >= block / 2) {
    return InvalidArgument("--kappa = " + std::to_string(kappa) + " must be < block/2 = " +
                           std::to_string(block / 2) + " (--block " + std::to_string(block) + ")");
  }
  if (sinks < 0 || sinks > block) {
    return InvalidArgument("--sinks = " + std::to_string(sinks) + " must be in [0, block]");
  }
  c.selector.block = block;
  c.selector.kappa = static_cast<int>(kappa);
  c.selector.sinks = static_cast<int>(sinks);

  const std::string archive = s.text("archive");
  if (archive == "ram") {
    c.archive = VestigeArchivePlacement::kRam;
  } else if (archive.rfind("file:", 0) == 0 && archive.size() > 5) {
    c.archive = VestigeArchivePlacement::kFile;
    c.archive_dir = archive.substr(5);
    struct stat sb;
    if (::stat(c.archive_dir.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode)) {
      return InvalidArgument("--archive = '" + archive + "': '" + c.archive_dir +
                             "' is not a directory");
    }
    if (::access(c.archive_dir.c_str(), W_OK) != 0) {
      return InvalidArgument("--archive = '" + archive + "': '" + c.archive_dir +
                             "' is not writable");
    }
  } else {
    return InvalidArgument("--archive = '" + archive + "' must be ram or file:DIR");
  }

  c.recall = s.Bool("recall");
  ASSIGN_OR_RETURN(c.recall_options, RecallOptions::FromSettings(s));
  c.rank_explicit = s.given("rank");
  if (c.recall && c.archive == VestigeArchivePlacement::kFile) {
    // Archived pages leave RAM, so the scan keeps its own bf16 copy of each closed row's branch
    // r_u (d_r x 2 B per row, counted in the tier's resident bytes) and the index build and the
    // calibration labels read row content back from the archive file (VestigePolicy::ReadRow).
    c.recall_options.branch_sidecar = true;
  }
  return c;
}

VestigePolicy::VestigePolicy(VestigeConfig cfg) : cfg_(std::move(cfg)), instance_(g_instances++) {}

VestigePolicy::~VestigePolicy() {
  // The archive files are this cache's working storage: they live exactly as long as the cache.
  for (Layer& L : layers_) {
    if (!L.file) continue;
    const std::string path = L.file->path();
    L.file.reset();
    ::unlink(path.c_str());
  }
}

StatusOr<std::unique_ptr<Policy>> VestigePolicy::Clone() const {
  if (cfg_.archive == VestigeArchivePlacement::kFile) {
    return Unimplemented("policy '" + name() + "' cannot be forked with archive=file:" +
                         cfg_.archive_dir +
                         " (its archive files are append-only, one per cache); use archive=ram");
  }
  auto c = std::make_unique<VestigePolicy>(cfg_);
  c->layers_.resize(layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& A = layers_[l];
    Layer& B = c->layers_[l];
    if (A.file || !A.staged.empty() || A.restored.size() != 0) {
      return Internal("policy '" + name() + "' layer " + std::to_string(l) +
                      " holds archive-file state in RAM placement");
    }
    B.mla = A.mla;
    B.k_dim = A.k_dim;
    B.sel = A.sel.Clone();
    B.before = A.before;
    B.last = A.last;
    B.prompt_call = A.prompt_call;
    B.compressed = A.compressed;
    B.released = A.released;
    ReserveAsIn(&B.released, A.released);
    B.restored_pos = A.restored_pos;
    ReserveAsIn(&B.restored_pos, A.restored_pos);
    B.restored = RowChunks(A.restored.width());
    B.released_bytes = A.released_bytes;
    B.staged_bytes = A.staged_bytes;
    B.rows = A.rows;
    B.archived = A.archived;
    B.fetched = A.fetched;
    B.ptrs.assign(A.ptrs.size(), nullptr);
    B.file_rows = A.file_rows;
    B.file_buf = A.file_buf;
    B.file_ok = A.file_ok;
    B.file_reads = A.file_reads;
  }
  if (recall_) {
    StatusOr<std::unique_ptr<VestigeRecallHook>> hook = recall_->Clone();
    if (!hook.ok()) {
      return hook.status().WithContext("policy '" + name() + "' cannot be forked");
    }
    c->recall_ = std::move(hook).value();
  }
  c->recovered_ = recovered_;
  c->closes_ = closes_;
  c->reads_ = reads_;
  c->fallbacks_ = fallbacks_;
  c->close_seconds_ = close_seconds_;
  return std::unique_ptr<Policy>(std::move(c));
}

Status VestigePolicy::Bind(const std::vector<LayerGeometry>& layers) {
  layers_.clear();
  layers_.resize(layers.size());
  int n_mla = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerGeometry& g = layers[l];
    if (g.kind != AttnKind::kMla) continue;
    ++n_mla;
    if (g.rope_dim < 1 || g.rope_dim >= g.k_dim) {
      return InvalidArgument(LayerName(g, l) + ": MLA branch width rope_dim = " +
                             std::to_string(g.rope_dim) + " must be in [1, k_dim = " +
                             std::to_string(g.k_dim) + ")");
    }
    Layer& L = layers_[l];
    L.mla = true;
    L.k_dim = g.k_dim;
    L.restored = RowChunks(g.k_dim);
    L.sel = VestigeSelector(cfg_.selector, g.k_dim, g.rope_dim);
    if (cfg_.archive == VestigeArchivePlacement::kFile) {
      const std::string path = cfg_.archive_dir + "/vestige-" + std::to_string(::getpid()) + "-" +
                               std::to_string(instance_) + "-layer" + std::to_string(l) + ".arc";
      ASSIGN_OR_RETURN(VestigeArchiveFile f, VestigeArchiveFile::Create(path, 2 * int64_t{g.k_dim},
                                                                        LayerStore::kPageRows));
      L.file = std::make_unique<VestigeArchiveFile>(std::move(f));
    }
  }
  if (n_mla == 0) {
    return InvalidArgument(name() + " selects MLA latent rows, but none of the model's " +
                           std::to_string(layers.size()) +
                           " attention layers is MLA (GQA only); use another policy");
  }
  if (cfg_.recall && !recall_) {
    if (!cfg_.rank_explicit) {
      for (const LayerGeometry& g : layers) {
        if (g.kind == AttnKind::kMla) {
          cfg_.recall_options.rank = std::min(cfg_.recall_options.rank, DefaultRecallRank(g));
        }
      }
    }
    for (size_t l = 0; l < layers.size(); ++l) {
      if (layers[l].kind == AttnKind::kMla) {
        RETURN_IF_ERROR(cfg_.recall_options.Validate(layers[l].k_dim - layers[l].rope_dim)
                            .WithContext(LayerName(layers[l], l)));
      }
    }
    auto hook = std::make_unique<TierHook>(cfg_.recall_options, layers);
    if (cfg_.archive == VestigeArchivePlacement::kFile) {
      hook->SetPolicyReader([this](int l, const LayerStore& st, int64_t u, uint16_t* out) {
        return ReadRow(l, st, u, out);
      });
    }
    recall_ = std::move(hook);
    RETURN_IF_ERROR(recall_->status());
  }
  return OkStatus();
}

const VestigeSelector& VestigePolicy::selector(int layer) const {
  STRATA_CHECK(layers_[layer].mla);
  return layers_[layer].sel;
}

int64_t VestigePolicy::n_closed(int layer) const {
  return layers_[layer].mla ? layers_[layer].sel.n_closed() : 0;
}

std::string VestigePolicy::archive_path(int layer) const {
  return layers_[layer].file ? layers_[layer].file->path() : std::string();
}

void VestigePolicy::NoteRecovered(const Status& s) {
  if (recovered_.ok() && !s.ok()) recovered_ = s;
}

Status VestigePolicy::recovered_error() const {
  if (!recovered_.ok()) return recovered_;
  return recall_ ? recall_->status() : OkStatus();
}

Status VestigePolicy::OnAppended(int layer, const LayerStore& store, const CacheCall& call,
                                 CachePlan* plan, ThreadPool* pool) {
  // The call's rows are in and its queries are still to read: blocks close here; their archived
  // pages leave RAM only at the end of a decode call (EndCall) or at a prefill's compression
  // point (OnCompress), after every query that reads its own block in full has read it.
  layers_[layer].prompt_call = call.kind == CallKind::kPrefill;
  return CloseReady(layer, store, pool);
}

Status VestigePolicy::EndCall(int layer, const LayerStore& store, const CacheCall& call,
                              CachePlan* plan) {
  layers_[layer].before = Layer::Before();  // every query of the call has read
  // A prefill's pages leave RAM at its compression point (OnCompress), not between its chunks:
  // its later queries read densely (see Read), which would stage every released page back from
  // the file, one pread per page and query (when pages left at every chunk's end and prompt
  // queries scanned, mostly falling back to dense reads: synth --preset 150m, a 16.6k-token
  // prompt, 2 threads, 40 % of the prefill in 8 minutes, ~14 tokens/s, against 82 with the RAM
  // archive). The pages a prefill holds are the full cache's, inside PeakResidentBytes.
  if (call.kind == CallKind::kPrefill) return OkStatus();
  return ArchivePages(layer, store, plan);
}

Status VestigePolicy::OnCompress(int layer, const LayerStore& store, CachePlan* plan,
                                 ThreadPool* pool) {
  layers_[layer].compressed = true;
  RETURN_IF_ERROR(CloseReady(layer, store, pool));
  RETURN_IF_ERROR(ArchivePages(layer, store, plan));
  if (recall_ && layers_[layer].mla) recall_->OnCompress(layer, store, pool);
  return OkStatus();
}

Status VestigePolicy::CloseReady(int layer, const LayerStore& store, ThreadPool* pool) {
  Layer& L = layers_[layer];
  if (!L.mla) return OkStatus();
  if (store.n_rows() - L.sel.n_closed() < cfg_.selector.block) return OkStatus();
  // The selection before this close: the call's queries before the new closed rows read with it
  // (see Read).
  L.before.n_closed = L.sel.n_closed();
  L.before.kept = L.sel.kept();
  L.before.valid = true;
  bool closed = false;
  while (store.n_rows() - L.sel.n_closed() >= cfg_.selector.block) {
    const auto t0 = std::chrono::steady_clock::now();
    L.sel.CloseBlock(store);
    close_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    closed = true;
    ++closes_;
  }
  if (!closed) return OkStatus();
  // Closing several blocks with one rebalance equals closing them one by one: sigma is
  // immutable and the selection depends only on the closed sigma.
  L.sel.Rebalance();
  return AfterSelection(layer, store, pool);
}

Status VestigePolicy::AfterSelection(int layer, const LayerStore& store, ThreadPool* pool) {
  Layer& L = layers_[layer];
  if (L.file) {
    // Kept rows of released pages (a rebalance can move archived rows back) are served from a
    // policy buffer, read once from the file; rows that left the kept set are dropped.
    const int64_t P = LayerStore::kPageRows;
    // Both sets are ascending: the old rows are consumed in order and their chunks freed as they
    // are, so the tier is never held twice.
    std::vector<int64_t> pos;
    RowChunks data(L.k_dim);
    size_t old = 0;
    pos.reserve(L.sel.kept().size());  // at most the kept rows: no doubling slack
    std::vector<uint16_t> scratch(L.k_dim);
    for (int64_t u : L.sel.kept()) {
      if (u / P >= static_cast<int64_t>(L.released.size()) || !L.released[u / P]) continue;
      while (old < L.restored_pos.size() && L.restored_pos[old] < u) ++old;
      L.restored.ReleaseBelow(old);
      if (old < L.restored_pos.size() && L.restored_pos[old] == u) {
        data.push_back(L.restored.row(old));
      } else {
        Status s = L.file->ReadRow(u, scratch.data());
        if (!s.ok()) {
          // Consistent even so: the rows rebuilt so far form the tier, any other row is read
          // from the file (the old tier's consumed chunks are gone).
          L.restored_pos = std::move(pos);
          L.restored = std::move(data);
          return s.WithContext("kept row " + std::to_string(u) +
                               " cannot be restored from the archive file " + L.file->path());
        }
        data.push_back(scratch.data());
      }
      pos.push_back(u);
    }
    L.restored_pos = std::move(pos);
    L.restored = std::move(data);
  }
  if (recall_) recall_->OnSelection(layer, store, L.sel.n_closed(), L.sel.archived(), pool);
  return OkStatus();
}

Status VestigePolicy::ArchivePages(int layer, const LayerStore& store, CachePlan* plan) {
  Layer& L = layers_[layer];
  if (!L.mla || !L.file || !L.file_ok) return OkStatus();
  const int64_t P = LayerStore::kPageRows;
  const int64_t n_pages = L.sel.n_closed() / P;  // block is a multiple of the page: whole pages
  L.released.resize(n_pages, 0);
  const std::vector<uint8_t>& kept = L.sel.kept_mask();
  // Every resident closed page is written once, all its rows, then released after one commit;
  // its kept rows move into the attended tier (below). Releasing only pages without a kept row
  // freed almost nothing at 1/32: a page of 64 rows holds none with probability (31/32)^64 = 13%.
  std::vector<int64_t> to_release;
  for (int64_t p = 0; p < n_pages; ++p) {
    if (L.released[p]) continue;
    // A page's rows are contiguous in the store: [P, k_dim] bf16 from its first row.
    Status s = L.file->AppendPage(p, store.key_row(0, p * P), P);
    if (!s.ok()) {
      // Exact fallback: the pages stay in RAM (reported by recovered_error()).
      NoteRecovered(s.WithContext(LayerName(store.geometry(), layer) +
                                  ": archive write failed, archived rows stay in RAM"));
      L.file_ok = false;
      return OkStatus();
    }
    to_release.push_back(p);
  }
  if (to_release.empty()) return OkStatus();
  Status s = L.file->Commit();
  if (!s.ok()) {
    NoteRecovered(s.WithContext(LayerName(store.geometry(), layer) +
                                ": archive commit failed, archived rows stay in RAM"));
    L.file_ok = false;
    return OkStatus();
  }
  // The attended tier: the kept rows of the pages released now are copied, exactly and once,
  // from the store (still resident: the cache applies the plan after this returns) into the
  // restored buffer, merged by position with the rows already there (pages are released in
  // position order, so this is an append unless an earlier write failed and was retried).
  size_t added = 0;
  for (int64_t p : to_release) {
    for (int64_t u = p * P; u < (p + 1) * P; ++u) added += kept[u] != 0;
  }
  const bool append = L.restored_pos.empty() || L.restored_pos.back() < to_release.front() * P;
  std::vector<int64_t> pos;
  RowChunks data(L.k_dim);
  if (append) {
    pos = std::move(L.restored_pos);
    data = std::move(L.restored);
  }
  pos.reserve(pos.size() + added);
  size_t old = 0;
  auto take_old_below = [&](int64_t u) {
    if (append) return;
    while (old < L.restored_pos.size() && L.restored_pos[old] < u) {
      pos.push_back(L.restored_pos[old]);
      data.push_back(L.restored.row(old));
      ++old;
    }
    L.restored.ReleaseBelow(old);
  };
  for (int64_t p : to_release) {
    for (int64_t u = p * P; u < (p + 1) * P; ++u) {
      if (!kept[u]) continue;
      take_old_below(u);
      pos.push_back(u);
      data.push_back(store.key_row(0, u));
    }
  }
  take_old_below(INT64_MAX);
  L.restored_pos = std::move(pos);
  L.restored = std::move(data);
  for (int64_t p : to_release) {
    plan->release.push_back({0, p});
    L.released[p] = 1;
    L.released_bytes += P * 2 * int64_t{L.k_dim};
  }
  return OkStatus();
}

int64_t VestigePolicy::observation_queries(int64_t prompt_len) const {
  return recall_ ? recall_->observation_queries(prompt_len) : 0;
}

int64_t VestigePolicy::observation_stride(int64_t n_observed) const {
  return recall_ ? recall_->observation_stride(n_observed) : 1;
}

Status VestigePolicy::OnPrefillStats(int layer, const LayerStore& store,
                                     const PrefillObservation& obs) {
  if (recall_ && layers_[layer].mla) recall_->Observe(layer, store, obs);
  return OkStatus();
}

const RecallTier* VestigePolicy::recall_tier(int layer) const {
  auto* t = dynamic_cast<const TierHook*>(recall_.get());
  return t ? t->tier(layer) : nullptr;
}

Status VestigePolicy::ReadRow(int layer, const LayerStore& store, int64_t row,
                              uint16_t* out) const {
  const Layer& L = layers_[layer];
  if (row < 0 || row >= store.n_rows()) {
    return OutOfRange("row " + std::to_string(row) + " of layer " + std::to_string(layer) + " (" +
                      std::to_string(store.n_rows()) + " rows)");
  }
  const int64_t p = row / LayerStore::kPageRows;
  const int64_t width = store.geometry().k_dim * int64_t{store.geometry().n_kv_heads};
  if (store.page_resident(0, p)) {
    std::memcpy(out, store.key_row(0, row), 2 * width);
    return OkStatus();
  }
  auto it = std::lower_bound(L.restored_pos.begin(), L.restored_pos.end(), row);
  if (it != L.restored_pos.end() && *it == row) {
    std::memcpy(out, L.restored.row(it - L.restored_pos.begin()), 2 * width);
    return OkStatus();
  }
  STRATA_CHECK(L.file != nullptr);
  return L.file->ReadRow(row, out);
}

VestigePolicy::ReadShape VestigePolicy::Shape(const Layer& L, int64_t limit) const {
  ReadShape r;
  // Causality: the selection over closed rows [0, n_closed) ranks them against each other (one
  // global top-m), so a query may use it only if it sees every one of those rows. A query of the
  // call that closed blocks and sits before their end reads with the selection from before the
  // close (its tail then starts at that selection's end, and the pages of the call's blocks are
  // still in the store until EndCall).
  r.before = L.before.valid && limit < L.sel.n_closed();
  const int64_t n_closed = r.before ? L.before.n_closed : L.sel.n_closed();
  // The tail: rows from the selection's end, or the query's own block when that block is closed
  // (a decode step that closes it: the block's kept rows alone might not include the query).
  const int64_t block = cfg_.selector.block;
  r.tail_begin = std::min(n_closed, (limit - 1) / block * block);
  const std::vector<int64_t>& kept = r.before ? L.before.kept : L.sel.kept();
  r.n_kept = std::lower_bound(kept.begin(), kept.end(), r.tail_begin) - kept.begin();
  return r;
}

bool VestigePolicy::ClaimDenseReads(int layer, const LayerStore& store, int64_t first_limit,
                                    int m, ReadStats* stats) {
  Layer& L = layers_[layer];
  const int64_t last = first_limit + m - 1;
  if (L.mla) {
    // Read's dense branch (a prompt query before the compression point, or nothing archived
    // below the query's tail: the kill switch), with every page in the store (ReadDense then
    // reads it as ReadPrefix does).
    if (AnyReleasedBelow(L, last)) return false;
    if (!(L.prompt_call && !L.compressed)) {
      for (int64_t limit = first_limit; limit <= last; ++limit) {
        const ReadShape shape = Shape(L, limit);
        if (shape.tail_begin != shape.n_kept) return false;  // archived rows below its tail
      }
    }
    reads_ += m;
    const ReadShape shape = Shape(L, last);
    VestigeReadInfo info;  // the last query's, as Read leaves it
    info.rows_kept = shape.n_kept;
    info.rows_tail = last - shape.tail_begin;
    info.rows_archived = shape.tail_begin - shape.n_kept;
    info.rows_attended = last;
    info.bytes_read = last * store.geometry().bytes_per_token();
    L.last = info;
    ClearStaged(L);
  }
  CountDenseReads(store.geometry(), first_limit, m, stats);
  return true;
}

Status VestigePolicy::Read(int layer, const LayerStore& store, const float* q, int64_t limit,
                           ThreadPool* pool, SoftmaxStates* st, ReadStats* stats) {
  Layer& L = layers_[layer];
  if (!L.mla) {  // GQA layers of a mixed model are read in full
    ReadPrefix(store, q, limit, pool, st, stats);
    return OkStatus();
  }
  STRATA_CHECK(limit >= 1 && limit <= store.n_rows());
  const ReadShape shape = Shape(L, limit);
  const bool before = shape.before;
  const int64_t tail_begin = shape.tail_begin, n_kept = shape.n_kept;
  const std::vector<int64_t>& kept = before ? L.before.kept : L.sel.kept();
  const int64_t n_arch = tail_begin - n_kept;
  VestigeReadInfo info;
  info.rows_kept = n_kept;
  info.rows_tail = limit - tail_begin;
  info.rows_archived = n_arch;
  ++reads_;
  ReadStats local;
  const int64_t file_reads0 = L.file_reads;
  auto finish = [&]() -> Status {
    info.file_reads = L.file_reads - file_reads0;
    L.last = info;
    if (stats) {
      stats->rows_attended += info.rows_attended;
      stats->rows_fetched += info.rows_fetched;
      stats->bytes_read += info.bytes_read;
      stats->fallbacks += info.fallback ? 1 : 0;
    }
    ClearStaged(L);  // staged pages serve one dense read
    return OkStatus();
  };
  auto fail = [&](const Status& s) {
    ClearStaged(L);
    return s.WithContext("vestige read of rows [0, " + std::to_string(limit) + ")");
  };
  if (n_arch == 0 || (L.prompt_call && !L.compressed)) {
    // Nothing archived below the tail: exactly the full policy's read (kill switch). So is a
    // prompt query before the layer's first compression point: prefill attention is dense and
    // compression changes what later queries read (the reference's serving form,
    // docs/reference/vestigekv.md §4). Its tier is not calibrated yet, and a scan with the sound
    // certificate mostly fell back to a dense read anyway, after reading the kept rows and the
    // tail and scanning the index (16.6k-token prompt, synth --preset 150m, 2 threads: 0.83x of
    // full's prefill tokens/s).
    auto r = ReadDense(L, store, q, limit, pool, st, &local);
    if (!r.ok()) return fail(r.status());
    info.rows_from_file = *r;
    info.rows_attended = local.rows_attended;
    info.bytes_read = local.bytes_read;
    return finish();
  }
  // Attended rows: kept below the tail, then the tail [tail_begin, limit).
  L.rows.assign(kept.begin(), kept.begin() + n_kept);
  for (int64_t u = tail_begin; u < limit; ++u) L.rows.push_back(u);
  // Tier 2 scans for queries that see every closed row (every decode step); a prompt query before
  // the blocks its own call closed reads the earlier selection's kept rows ∪ its tail, no scan.
  const bool scan = recall_ != nullptr && !before;
  auto attended = ReadSet(L, store, q, L.rows, pool, st, &local);
  if (!attended.ok()) return fail(attended.status());
  int64_t extra = *attended;
  L.fetched.clear();
  bool fallback = false;
  if (scan) {
    const std::vector<int64_t>& arch = L.sel.archived();
    L.archived.assign(arch.begin(), arch.end());  // all < n_closed <= limit
    recall_->Fetch(layer, store, q, limit, L.rows, *st, L.archived, pool, &L.fetched, &fallback);
    info.bytes_read += n_arch * recall_->ScanBytesPerArchivedRow(layer);
    std::sort(L.fetched.begin(), L.fetched.end());
    L.fetched.erase(std::unique(L.fetched.begin(), L.fetched.end()), L.fetched.end());
    // Rows of the query's own block are already read as its tail.
    L.fetched.erase(std::lower_bound(L.fetched.begin(), L.fetched.end(), tail_begin),
                    L.fetched.end());
    for (int64_t u : L.fetched) {
      // A fetched row must be archived, else it would be counted twice in the softmax.
      if (u < 0 || u >= tail_begin || L.sel.kept_mask()[u]) {  // (scan: the current selection)
        return fail(Internal("the recall tier fetched row " + std::to_string(u) +
                             ", which is not an archived row below " +
                             std::to_string(tail_begin)));
      }
    }
  }
  if (fallback) {
    // Dense step: the full policy's own read, bit for bit (§9.17), with released
    // pages staged from the file for this step.
    ++fallbacks_;
    info.fallback = true;
    st->Reset();
    local = ReadStats();
    auto r = ReadDense(L, store, q, limit, pool, st, &local);
    if (!r.ok()) return fail(r.status());
    info.rows_from_file = *r;
    info.rows_attended = local.rows_attended;
    info.rows_fetched = n_arch;
    info.bytes_read += local.bytes_read;
    return finish();
  }
  // Fetched rows are archived, hence disjoint from the attended set: merging their state into st
  // completes one exact softmax over kept ∪ tail ∪ fetched.
  if (!L.fetched.empty()) {
    auto r = ReadSet(L, store, q, L.fetched, pool, st, &local);
    if (!r.ok()) return fail(r.status());
    extra += *r;
  }
  info.rows_fetched = static_cast<int64_t>(L.fetched.size());
  info.rows_from_file = extra;
  info.rows_attended = local.rows_attended;
  info.bytes_read += local.bytes_read;
  return finish();
}

bool VestigePolicy::AnyReleasedBelow(const Layer& L, int64_t limit) const {
  if (!L.file || limit <= 0) return false;
  const int64_t P = LayerStore::kPageRows;
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(L.released.size()), (limit + P - 1) / P);
  return std::find(L.released.begin(), L.released.begin() + n, uint8_t{1}) !=
         L.released.begin() + n;
}

// A row of a released page that the file could not serve: the read fails with it, never
// silently leaving the row out.
static Status UnreadableRow(const VestigeArchiveFile& file, int64_t row, const Status& cause) {
  // The cause names the file already when there is one.
  return DataLoss("archived row " + std::to_string(row) + " cannot be read back: " +
                  (cause.ok() ? "archive '" + file.path() + "'" : cause.message()));
}

StatusOr<const VestigePolicy::Layer::Staged*> VestigePolicy::StagePage(Layer& L, int64_t p) {
  auto it = L.staged.find(p);
  if (it != L.staged.end()) return &it->second;
  const int64_t P = LayerStore::kPageRows;
  const size_t K = L.k_dim;
  Layer::Staged& s = L.staged[p];
  s.rows.Resize(P * K);
  L.staged_bytes += static_cast<int64_t>(s.rows.bytes());
  std::vector<int64_t> bad;
  ++L.file_reads;
  Status st = L.file->ReadRowRange(p * P, P, s.rows.data(), &bad);
  // A kept row the file cannot serve is still in the restored buffer.
  for (int64_t u : bad) {
    auto r = std::lower_bound(L.restored_pos.begin(), L.restored_pos.end(), u);
    if (r == L.restored_pos.end() || *r != u) return UnreadableRow(*L.file, u, st);
    std::memcpy(s.rows.data() + (u - p * P) * K, L.restored.row(r - L.restored_pos.begin()),
                2 * K);
  }
  if (bad.empty() && !st.ok()) return st;
  return &s;
}

void VestigePolicy::ClearStaged(Layer& L) {
  if (L.staged.empty()) return;
  L.staged.clear();
  L.staged_bytes = 0;
}

StatusOr<int64_t> VestigePolicy::ReadSet(Layer& L, const LayerStore& store, const float* q,
                                         const std::vector<int64_t>& rows, ThreadPool* pool,
                                         SoftmaxStates* st, ReadStats* local) {
  const int64_t n = static_cast<int64_t>(rows.size());
  if (n == 0) return int64_t{0};
  if (!AnyReleasedBelow(L, rows.back() + 1)) {
    ReadRows(store, q, rows.data(), n, pool, st, local);
    return int64_t{0};
  }
  // Where each row lives: null for a resident page; else the restored buffer (kept rows) or one
  // pread (fetched rows).
  const int64_t P = LayerStore::kPageRows;
  const size_t K = L.k_dim;
  L.ptrs.assign(n, nullptr);
  L.file_rows.clear();
  int64_t outside = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t u = rows[i], p = u / P;
    if (p >= static_cast<int64_t>(L.released.size()) || !L.released[p]) continue;
    ++outside;
    auto r = std::lower_bound(L.restored_pos.begin(), L.restored_pos.end(), u);
    if (r != L.restored_pos.end() && *r == u) {
      L.ptrs[i] = L.restored.row(r - L.restored_pos.begin());
    } else {
      L.file_rows.push_back(static_cast<size_t>(i));
    }
  }
  L.file_buf.resize(L.file_rows.size() * K);
  for (size_t j = 0; j < L.file_rows.size(); ++j) {
    const size_t i = L.file_rows[j];
    ++L.file_reads;
    Status s = L.file->ReadRow(rows[i], L.file_buf.data() + j * K);
    if (!s.ok()) return UnreadableRow(*L.file, rows[i], s);
    L.ptrs[i] = L.file_buf.data() + j * K;
  }
  ReadRows(store, q, rows.data(), n, pool, st, local, L.ptrs.data());
  return outside;
}

StatusOr<int64_t> VestigePolicy::ReadDense(Layer& L, const LayerStore& store, const float* q,
                                           int64_t limit, ThreadPool* pool, SoftmaxStates* st,
                                           ReadStats* local) {
  if (!AnyReleasedBelow(L, limit)) {
    ReadPrefix(store, q, limit, pool, st, local);
    return int64_t{0};
  }
  const int64_t P = LayerStore::kPageRows;
  const int64_t n_pages = (limit + P - 1) / P;
  std::vector<const uint16_t*> pages(n_pages, nullptr);
  int64_t outside = 0;
  for (int64_t p = 0; p < n_pages; ++p) {
    if (p >= static_cast<int64_t>(L.released.size()) || !L.released[p]) continue;
    ASSIGN_OR_RETURN(const Layer::Staged* s, StagePage(L, p));
    pages[p] = s->rows.data();
    outside += std::min(P, limit - p * P);
  }
  ReadPrefix(store, q, limit, pool, st, local, pages.data());
  return outside;
}

VestigeResidency VestigePolicy::Residency(int layer, const LayerStore& store) const {
  const Layer& L = layers_[layer];
  VestigeResidency r;
  r.store_bytes = store.resident_bytes();
  if (!L.mla) return r;
  r.restored_bytes =
      L.restored.bytes() + static_cast<int64_t>(L.restored_pos.capacity() * sizeof(int64_t));
  r.staged_bytes = L.staged_bytes;
  r.metadata_bytes = L.sel.MetadataBytes() + static_cast<int64_t>(L.released.capacity());
  r.index_bytes = recall_ ? recall_->ResidentBytes(layer) : 0;
  r.file_bytes = L.file ? L.file->file_bytes() : 0;
  r.released_bytes = L.released_bytes;
  return r;
}

ResidentParts VestigePolicy::ResidentBreakdown(int layer, const LayerStore& store) const {
  const VestigeResidency r = Residency(layer, store);
  ResidentParts p;
  p.parts = {{"tail and pages", r.store_bytes},
             {"attended tier", r.restored_bytes},
             {"recall index", r.index_bytes},
             {"selection metadata", r.metadata_bytes},
             {"buffers", r.staged_bytes}};
  p.file_bytes = r.file_bytes;
  return p;
}

int64_t VestigePolicy::PeakResidentBytes(int layer, const LayerGeometry& g,
                                         int64_t n_rows) const {
  int64_t b = FullPageBytes(g, n_rows);
  const Layer& L = layers_[layer];
  if (!L.mla || n_rows <= 0) return b;
  const int64_t n = n_rows;  // closed rows <= n
  const int64_t pages = n / LayerStore::kPageRows + 1;
  const int64_t kept = std::min(n, VestigeBudget(n, cfg_.selector.ratio) + cfg_.selector.sinks);
  auto slack = [](int64_t bytes) { return bytes + bytes / 16 + 64; };  // GrowTo's 1/16
  // Selection metadata: sigma, the kept mask, the kept and archived lists (each at most the rows
  // it ever held), the released-page flags.
  b += slack(4 * n) + n + 8 * (kept + n) + 2 * pages;
  // The attended tier (file placement): RowChunks holds at most twice its rows while small and
  // one 256-row chunk of slack after, plus the chunk list and the positions.
  if (cfg_.archive == VestigeArchivePlacement::kFile) {
    const int64_t chunk = static_cast<int64_t>(RowChunks::kChunkRows);
    const int64_t rows = kept + std::min(kept, chunk);
    b += rows * g.k_dim * 2 + 16 * (kept / chunk + 2) + 16 * kept;
  }
  if (cfg_.recall) {
    const RecallOptions& r = cfg_.recall_options;
    const int64_t d_c = g.k_dim - g.rope_dim, tiles = (n + 15) / 16;
    b += slack(tiles * 16 * (2 * int64_t{r.rank} + 4));   // csk and eta, whole 16-row tiles
    if (r.branch_sidecar) b += slack(n * 2 * g.rope_dim);
    b += slack(2 * tiles) + 2 * tiles + 8 * n;           // archive mask, tile fires, fetch list
    b += 4 * int64_t{r.rank} * d_c;                      // the basis
    const int64_t queries =
        r.calibration == RecallCalibration::kPrefix
            ? (r.prefix_max_queries > 0 ? std::min<int64_t>(n / 2 + 1, 2 * r.prefix_max_queries + 1)
                                        : n / 2 + 1)
            : int64_t{r.decode_max} + 1;
    b += queries * (4 * int64_t{g.n_q_heads} * g.k_dim + 8);  // recorded calibration queries
  }
  return b;
}

int64_t VestigePolicy::ResidentBytes(int layer, const LayerStore& store) const {
  const VestigeResidency r = Residency(layer, store);
  return r.store_bytes + r.restored_bytes + r.staged_bytes + r.metadata_bytes + r.index_bytes;
}

PolicySummary VestigePolicy::Summary(int layer, const LayerStore& store) const {
  const Layer& L = layers_[layer];
  PolicySummary s = Policy::Summary(layer, store);
  s.rows_kept = s.rows_visible;
  s.blocks_closed = 0;
  s.compressed = false;
  if (!L.mla) return s;  // not a row layer: read like `full`
  const int64_t n_closed = L.sel.n_closed();
  s.rows_kept = static_cast<int64_t>(L.sel.kept().size()) + (store.n_rows() - n_closed);
  s.blocks_closed = n_closed / cfg_.selector.block;
  s.compressed = !L.sel.archived().empty();
  // What would hold less: the archive out of RAM, and a recall index above its quarter of the row.
  if (cfg_.archive == VestigeArchivePlacement::kRam && s.compressed) {
    s.remedy = "archive=file keeps the archived rows on disk instead of in RAM";
  }
  if (cfg_.recall && cfg_.rank_explicit) {
    const LayerGeometry& g = store.geometry();
    const int best = DefaultRecallRank(g);
    if (cfg_.recall_options.rank > best) {
      const std::string r = std::to_string(best);
      std::string more = "rank=" + r + " shrinks the recall index to 2 x " + r + " + 4 + 2 x " +
                         std::to_string(g.rope_dim) + " bytes per archived row (rank " +
                         std::to_string(cfg_.recall_options.rank) + ": " +
                         std::to_string(2 * cfg_.recall_options.rank + 4 + 2 * g.rope_dim) +
                         " of the " + std::to_string(2 * g.k_dim) + "-byte row)";
      s.remedy = s.remedy.empty() ? more : s.remedy + "; " + more;
    }
  }
  if (n_closed == 0) {
    s.note = "no block closed: " + std::to_string(store.n_rows()) + " rows < block " +
             std::to_string(cfg_.selector.block);
  } else if (!s.compressed) {
    s.note = "every closed row kept (" + std::to_string(L.sel.kept().size()) + " of " +
             std::to_string(n_closed) + ")";
  }
  return s;
}

int DefaultRecallRank(const LayerGeometry& g) {
  const int d_c = g.k_dim - g.rope_dim, d_r = g.rope_dim;
  const int64_t row_bytes = 2 * int64_t{g.k_dim};
  int rank = std::min(64, d_c / 8 * 8);
  while (rank > 8 && 4 * (2 * int64_t{rank} + 4 + 2 * int64_t{d_r}) > row_bytes) rank -= 8;
  return std::max(rank, 8);
}

StatusOr<std::unique_ptr<Policy>> MakeVestigePolicy(const PolicySpec& spec, bool full_row) {
  ASSIGN_OR_RETURN(VestigeConfig cfg, VestigeConfig::FromSpec(spec, full_row));
  return std::unique_ptr<Policy>(new VestigePolicy(std::move(cfg)));
}

}  // namespace strata
