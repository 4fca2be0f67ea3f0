// libFuzzer target: a VestigeKV archive file (kv/vestige/archive.h): Open (header and every
// committed record verified), then row reads of the pages it holds.
//
// Input: one mode byte, then the file. Checksums guard every header, row and record, so random
// mutations almost never get past them; when bit 0 of the mode byte is set the harness recomputes
// them (header, then each record the header claims, walked like Open walks them) before the
// file is opened, which lets the fuzzer reach the size arithmetic and the reads behind the
// checksums. With bit 0 clear the bytes are opened as they are (the checksum checks themselves).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "kv/vestige/archive.h"

namespace {

volatile uint64_t g_sink = 0;

uint64_t Get(const uint8_t* p, int n) {
  uint64_t v = 0;
  std::memcpy(&v, p, n);
  return v;
}
void Put64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }

// Recomputes the checksums the format defines, in place; stops at the first record that does not
// fit in the bytes (Open must then refuse the file on its own).
void FixChecksums(std::vector<uint8_t>* file) {
  uint8_t* b = file->data();
  const uint64_t size = file->size();
  if (size < 48) return;
  Put64(b + 40, strata::VestigeFnv64(b, 40));
  const uint64_t row_bytes = Get(b + 12, 4), n_records = Get(b + 32, 8);
  uint64_t off = 48;
  for (uint64_t r = 0; r < n_records && off + 16 <= size; ++r) {
    const uint64_t n_rows = Get(b + off + 8, 4);
    // Record bytes in 128 bits: the u32 fields overflow 64-bit arithmetic (what D6 is about).
    const unsigned __int128 bytes = 24 + static_cast<unsigned __int128>(n_rows) * (row_bytes + 8);
    if (bytes > size - off) return;
    for (uint64_t i = 0; i < n_rows; ++i) {
      uint8_t* row = b + off + 16 + i * (row_bytes + 8);
      Put64(row + row_bytes, strata::VestigeFnv64(row, row_bytes));
    }
    const uint64_t n = static_cast<uint64_t>(bytes);
    Put64(b + off + n - 8, strata::VestigeFnv64(b + off, n - 8));
    off += n;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::vector<uint8_t> bytes(data + 1, data + size);
  if (data[0] & 1) FixChecksums(&bytes);
  static strata::fuzz::MemFile file;
  file.Set(bytes.data(), bytes.size());
  auto a = strata::VestigeArchiveFile::Open(file.path());
  if (!a.ok()) return 0;
  const int64_t row_bytes = a->row_bytes(), page_rows = a->page_rows();
  g_sink = g_sink + a->n_records() + a->file_bytes();
  // Every record the file holds is at most its size, so a page that exists bounds the buffers
  // below; for absent pages one row is read only when a row is small.
  std::vector<uint8_t> out;
  std::vector<int64_t> bad;
  for (int64_t page = 0; page < 64; ++page) {
    if (!a->HasPage(page)) {
      if (row_bytes <= 4096) {
        out.resize(row_bytes);
        g_sink = g_sink + a->ReadRow(page * page_rows, out.data()).ok();
        g_sink = g_sink + a->ReadRowRange(page * page_rows, 1, out.data(), &bad).ok();
      }
      continue;
    }
    out.resize(row_bytes);
    int64_t n = 0;  // rows the record holds: rows are read until the first NotFound
    for (; n < page_rows && n < 256; ++n) {
      const strata::Status s = a->ReadRow(page * page_rows + n, out.data());
      if (s.code() == strata::StatusCode::kNotFound) break;
    }
    if (n == 0) continue;
    out.resize(static_cast<size_t>(n * row_bytes));
    bad.clear();
    g_sink = g_sink + a->ReadRowRange(page * page_rows, n, out.data(), &bad).ok() + bad.size();
    // A range running one row past the record must fail as a whole, never read past it.
    out.resize(static_cast<size_t>((n + 1) * row_bytes));
    bad.clear();
    g_sink = g_sink + a->ReadRowRange(page * page_rows, n + 1, out.data(), &bad).ok() + bad.size();
  }
  return 0;
}
