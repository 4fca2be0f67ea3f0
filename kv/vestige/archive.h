// VestigeKV archive file: append-only, checksummed page records of rows a layer no longer keeps.
//
// Rows the selector archives are never modified or deleted. With `--archive file:DIR`, a 64-row
// page whose rows are all archived is written here once and its RAM is released; recalled (or
// re-kept) rows are read back with pread. The format is built so that a process killed mid-write,
// a truncated file or a flipped byte is reported as DataLoss and never read as rows:
//
//   header (48 B): magic "STRVARC1" | u32 version (1) | u32 row_bytes | u32 page_rows | u32 0 |
//                  u64 committed_bytes (record bytes after the header that are durable) |
//                  u64 n_records | u64 FNV-1a-64 of the preceding 40 bytes
//   record:        u64 page index | u32 n_rows | u32 0 |
//                  n_rows x (row_bytes of bf16 data | u64 FNV-1a-64 of that row) |
//                  u64 FNV-1a-64 of everything above in the record
//
// Commit protocol: records are written past the committed length, fdatasync'd, then the header
// (new committed_bytes, n_records, checksum) is rewritten and fdatasync'd. A crash before the
// header write leaves uncommitted bytes that Open ignores; a crash during it leaves a header whose
// checksum fails (DataLoss). All integers are little-endian (the engine targets x86-64/arm64).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace strata {

class VestigeArchiveFile {
 public:
  static constexpr uint32_t kVersion = 1;
  static constexpr int64_t kHeaderBytes = 48;
  // Limits on a row and a page (far above any cache: an MLA row is ~1 KiB, a page 64 rows), so
  // that a record's size, 16 + n_rows * (row_bytes + 8) + 8, cannot overflow from a file's header.
  static constexpr int64_t kMaxRowBytes = int64_t{1} << 20;
  static constexpr int64_t kMaxPageRows = int64_t{1} << 16;

  // Creates (truncating) `path` for rows of `row_bytes` bytes in pages of `page_rows` rows.
  static StatusOr<VestigeArchiveFile> Create(const std::string& path, int64_t row_bytes,
                                             int64_t page_rows);
  // Opens an existing file read-only, verifying the header and every committed record.
  // DataLoss (naming the path and the offset) on any mismatch or truncation.
  static StatusOr<VestigeArchiveFile> Open(const std::string& path);

  VestigeArchiveFile() = default;
  ~VestigeArchiveFile();
  VestigeArchiveFile(VestigeArchiveFile&& o) noexcept;
  VestigeArchiveFile& operator=(VestigeArchiveFile&& o) noexcept;
  VestigeArchiveFile(const VestigeArchiveFile&) = delete;
  VestigeArchiveFile& operator=(const VestigeArchiveFile&) = delete;

  // Writes one page record (not yet durable; see Commit). rows: [n_rows, row_bytes] raw bytes.
  // A page may be written once; writing it again is InvalidArgument.
  Status AppendPage(int64_t page, const void* rows, int64_t n_rows);
  // Makes every appended record durable (fdatasync, header, fdatasync).
  Status Commit();
  // Reads row `row` (page * page_rows + i) into out[row_bytes], verifying its checksum.
  // NotFound when its page is not in the file; DataLoss on a checksum mismatch or short read.
  Status ReadRow(int64_t row, void* out) const;
  // Reads rows [first, first + n) of one page with one pread, verifying every row's checksum.
  // out: [n, row_bytes]. A row that fails its checksum is zeroed in `out` and appended to *bad;
  // the first such error is returned and the other rows are good. When the read itself fails
  // (page not in the file, rows past the record, short read, I/O error) every row is bad.
  Status ReadRowRange(int64_t first, int64_t n, void* out, std::vector<int64_t>* bad) const;
  bool HasPage(int64_t page) const { return index_.count(page) != 0; }

  const std::string& path() const { return path_; }
  int64_t row_bytes() const { return row_bytes_; }
  int64_t page_rows() const { return page_rows_; }
  int64_t n_records() const { return static_cast<int64_t>(index_.size()); }
  // Bytes of the file (header + records, committed or not).
  int64_t file_bytes() const { return kHeaderBytes + end_; }

 private:
  struct Loc {
    int64_t offset;  // of the record in the file
    int64_t n_rows;
  };
  Status WriteHeader();
  int64_t RecordBytes(int64_t n_rows) const { return 16 + n_rows * (row_bytes_ + 8) + 8; }

  std::string path_;
  int fd_ = -1;
  bool writable_ = false;
  int64_t row_bytes_ = 0, page_rows_ = 0;
  int64_t committed_ = 0;  // record bytes made durable
  int64_t end_ = 0;        // record bytes written
  std::unordered_map<int64_t, Loc> index_;
};

// FNV-1a 64-bit over bytes (exposed for tests).
uint64_t VestigeFnv64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull);

}  // namespace strata
