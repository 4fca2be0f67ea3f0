#include "core/scratch.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

namespace strata {
namespace {

constexpr size_t kAlign = 64;
constexpr size_t kMinBlock = size_t{1} << 20;

struct Block {
  char* p = nullptr;
  size_t cap = 0;
  size_t used = 0;
};

// One per thread. Blocks are used in order; a request that fits nowhere appends a block as large
// as all the others together (or the request). When the outermost scope ends with more than one
// block, they are replaced by one block of their total size, so from the next call on the whole
// working set comes from one block and nothing is allocated.
struct Arena {
  std::vector<Block> blocks;
  size_t cur = 0;
  int depth = 0;

  ~Arena() {
    for (Block& b : blocks) std::free(b.p);
  }
  size_t Total() const {
    size_t t = 0;
    for (const Block& b : blocks) t += b.cap;
    return t;
  }
  void Append(size_t bytes) {
    size_t cap = std::max({bytes, Total(), kMinBlock});
    cap = (cap + kAlign - 1) / kAlign * kAlign;
    char* p = static_cast<char*>(std::aligned_alloc(kAlign, cap));
    if (p == nullptr) throw std::bad_alloc();
    blocks.push_back(Block{p, cap, 0});
  }
  void* Take(size_t bytes) {
    bytes = (bytes + kAlign - 1) / kAlign * kAlign;
    if (blocks.empty()) Append(bytes);
    while (blocks[cur].cap - blocks[cur].used < bytes) {
      if (cur + 1 == blocks.size()) Append(bytes);
      ++cur;
      blocks[cur].used = 0;
    }
    Block& b = blocks[cur];
    char* p = b.p + b.used;
    b.used += bytes;
    return p;
  }
  void Consolidate() {
    const size_t total = Total();
    for (Block& b : blocks) std::free(b.p);
    blocks.clear();
    cur = 0;
    Append(total);
  }
};

Arena& ThreadArena() {
  thread_local Arena arena;
  return arena;
}

}  // namespace

ScratchScope::ScratchScope() {
  Arena& a = ThreadArena();
  ++a.depth;
  block_ = a.cur;
  used_ = a.blocks.empty() ? 0 : a.blocks[a.cur].used;
}

ScratchScope::~ScratchScope() {
  Arena& a = ThreadArena();
  for (size_t i = block_ + 1; i < a.blocks.size(); ++i) a.blocks[i].used = 0;
  a.cur = block_;
  if (!a.blocks.empty()) a.blocks[block_].used = used_;
  if (--a.depth == 0 && a.blocks.size() > 1) a.Consolidate();
}

void* ScratchScope::Bytes(size_t bytes, bool zero) {
  if (bytes == 0) return nullptr;
  void* p = ThreadArena().Take(bytes);
  if (zero) std::memset(p, 0, bytes);
  return p;
}

size_t ScratchBytesHeld() { return ThreadArena().Total(); }

}  // namespace strata
