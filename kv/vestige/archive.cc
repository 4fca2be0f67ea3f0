#include "kv/vestige/archive.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace strata {
namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'V', 'A', 'R', 'C', '1'};

void Put32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
void Put64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t Get32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t Get64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

std::string Errno() { return std::strerror(errno); }

Status PwriteAll(int fd, const void* buf, int64_t n, int64_t off, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(buf);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, static_cast<size_t>(n), off);
    if (w < 0) {
      if (errno == EINTR) continue;
      return IoError("write to archive '" + path + "' at offset " + std::to_string(off) +
                     " failed: " + Errno());
    }
    p += w;
    n -= w;
    off += w;
  }
  return OkStatus();
}

// Reads exactly n bytes; DataLoss when the file ends first.
Status PreadAll(int fd, void* buf, int64_t n, int64_t off, const std::string& path) {
  auto* p = static_cast<uint8_t*>(buf);
  const int64_t start = off;
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, static_cast<size_t>(n), off);
    if (r < 0) {
      if (errno == EINTR) continue;
      return IoError("read of archive '" + path + "' at offset " + std::to_string(off) +
                     " failed: " + Errno());
    }
    if (r == 0) {
      return DataLoss("archive '" + path + "' is truncated: " + std::to_string(n) +
                      " bytes missing at offset " + std::to_string(off) + " (read from " +
                      std::to_string(start) + ")");
    }
    p += r;
    n -= r;
    off += r;
  }
  return OkStatus();
}

}  // namespace

uint64_t VestigeFnv64(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

VestigeArchiveFile::~VestigeArchiveFile() {
  if (fd_ >= 0) ::close(fd_);
}

VestigeArchiveFile::VestigeArchiveFile(VestigeArchiveFile&& o) noexcept { *this = std::move(o); }

VestigeArchiveFile& VestigeArchiveFile::operator=(VestigeArchiveFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    writable_ = o.writable_;
    row_bytes_ = o.row_bytes_;
    page_rows_ = o.page_rows_;
    committed_ = o.committed_;
    end_ = o.end_;
    index_ = std::move(o.index_);
    o.fd_ = -1;
  }
  return *this;
}

StatusOr<VestigeArchiveFile> VestigeArchiveFile::Create(const std::string& path, int64_t row_bytes,
                                                        int64_t page_rows) {
  if (row_bytes <= 0 || page_rows <= 0 || row_bytes > kMaxRowBytes || page_rows > kMaxPageRows) {
    return InvalidArgument("archive '" + path + "': row_bytes " + std::to_string(row_bytes) +
                           " or page_rows " + std::to_string(page_rows) + " outside [1, " +
                           std::to_string(kMaxRowBytes) + "] / [1, " +
                           std::to_string(kMaxPageRows) + "]");
  }
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return IoError("cannot create archive file '" + path + "': " + Errno());
  VestigeArchiveFile f;
  f.path_ = path;
  f.fd_ = fd;
  f.writable_ = true;
  f.row_bytes_ = row_bytes;
  f.page_rows_ = page_rows;
  RETURN_IF_ERROR(f.WriteHeader());
  if (::fdatasync(fd) != 0) return IoError("fdatasync of archive '" + path + "': " + Errno());
  return f;
}

Status VestigeArchiveFile::WriteHeader() {
  uint8_t h[kHeaderBytes] = {};
  std::memcpy(h, kMagic, 8);
  Put32(h + 8, kVersion);
  Put32(h + 12, static_cast<uint32_t>(row_bytes_));
  Put32(h + 16, static_cast<uint32_t>(page_rows_));
  Put32(h + 20, 0);
  Put64(h + 24, static_cast<uint64_t>(committed_));
  Put64(h + 32, static_cast<uint64_t>(n_records()));
  Put64(h + 40, VestigeFnv64(h, 40));
  return PwriteAll(fd_, h, kHeaderBytes, 0, path_);
}

StatusOr<VestigeArchiveFile> VestigeArchiveFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError("cannot open archive file '" + path + "': " + Errno());
  VestigeArchiveFile f;
  f.path_ = path;
  f.fd_ = fd;
  uint8_t h[kHeaderBytes];
  RETURN_IF_ERROR(PreadAll(fd, h, kHeaderBytes, 0, path).WithContext("header"));
  if (std::memcmp(h, kMagic, 8) != 0) return DataLoss("'" + path + "' is not a VestigeKV archive");
  if (Get64(h + 40) != VestigeFnv64(h, 40)) {
    return DataLoss("archive '" + path + "': header checksum mismatch (interrupted commit?)");
  }
  if (Get32(h + 8) != kVersion) {
    return DataLoss("archive '" + path + "': version " + std::to_string(Get32(h + 8)) +
                    ", this build reads " + std::to_string(kVersion));
  }
  f.row_bytes_ = Get32(h + 12);
  f.page_rows_ = Get32(h + 16);
  const uint64_t committed = Get64(h + 24), n_records = Get64(h + 32);
  struct stat sb;
  if (::fstat(fd, &sb) != 0) return IoError("fstat of archive '" + path + "': " + Errno());
  if (f.row_bytes_ <= 0 || f.page_rows_ <= 0 || Get32(h + 20) != 0 ||
      f.row_bytes_ > kMaxRowBytes || f.page_rows_ > kMaxPageRows) {
    return DataLoss("archive '" + path + "': bad header fields (row_bytes " +
                    std::to_string(f.row_bytes_) + ", page_rows " + std::to_string(f.page_rows_) +
                    "; each must be in [1, " + std::to_string(kMaxRowBytes) + "] / [1, " +
                    std::to_string(kMaxPageRows) + "])");
  }
  if (committed > static_cast<uint64_t>(sb.st_size - kHeaderBytes)) {
    return DataLoss("archive '" + path + "' is truncated: header commits " +
                    std::to_string(committed) + " record bytes, file holds " +
                    std::to_string(sb.st_size - kHeaderBytes));
  }
  // Verify every committed record.
  int64_t off = 0;
  std::vector<uint8_t> rec;
  for (uint64_t r = 0; r < n_records; ++r) {
    uint8_t rh[16];
    if (off + 16 > static_cast<int64_t>(committed)) {
      return DataLoss("archive '" + path + "': record " + std::to_string(r) +
                      " lies past the committed length");
    }
    RETURN_IF_ERROR(PreadAll(fd, rh, 16, kHeaderBytes + off, path));
    const int64_t page = static_cast<int64_t>(Get64(rh));
    const int64_t n_rows = Get32(rh + 8);
    if (n_rows <= 0 || n_rows > f.page_rows_ || Get32(rh + 12) != 0 || page < 0) {
      return DataLoss("archive '" + path + "': bad record header at offset " +
                      std::to_string(kHeaderBytes + off));
    }
    const int64_t bytes = f.RecordBytes(n_rows);
    if (off + bytes > static_cast<int64_t>(committed)) {
      return DataLoss("archive '" + path + "': record at offset " +
                      std::to_string(kHeaderBytes + off) + " overruns the committed length");
    }
    rec.resize(bytes);
    RETURN_IF_ERROR(PreadAll(fd, rec.data(), bytes, kHeaderBytes + off, path));
    if (Get64(rec.data() + bytes - 8) != VestigeFnv64(rec.data(), bytes - 8)) {
      return DataLoss("archive '" + path + "': checksum mismatch in the record at offset " +
                      std::to_string(kHeaderBytes + off) + " (page " + std::to_string(page) + ")");
    }
    if (!f.index_.emplace(page, Loc{off, n_rows}).second) {
      return DataLoss("archive '" + path + "': page " + std::to_string(page) + " recorded twice");
    }
    off += bytes;
  }
  if (off != static_cast<int64_t>(committed)) {
    return DataLoss("archive '" + path + "': records end at " + std::to_string(off) +
                    ", header commits " + std::to_string(committed));
  }
  f.committed_ = f.end_ = off;
  return f;
}

Status VestigeArchiveFile::AppendPage(int64_t page, const void* rows, int64_t n_rows) {
  if (!writable_) return InvalidArgument("archive '" + path_ + "' was opened read-only");
  if (n_rows <= 0 || n_rows > page_rows_) {
    return InvalidArgument("archive page of " + std::to_string(n_rows) + " rows (page_rows " +
                           std::to_string(page_rows_) + ")");
  }
  if (index_.count(page)) {
    return InvalidArgument("archive '" + path_ + "': page " + std::to_string(page) +
                           " already written (rows are written once)");
  }
  const int64_t bytes = RecordBytes(n_rows);
  std::vector<uint8_t> rec(bytes);
  Put64(rec.data(), static_cast<uint64_t>(page));
  Put32(rec.data() + 8, static_cast<uint32_t>(n_rows));
  Put32(rec.data() + 12, 0);
  const auto* src = static_cast<const uint8_t*>(rows);
  for (int64_t i = 0; i < n_rows; ++i) {
    uint8_t* dst = rec.data() + 16 + i * (row_bytes_ + 8);
    std::memcpy(dst, src + i * row_bytes_, row_bytes_);
    Put64(dst + row_bytes_, VestigeFnv64(dst, row_bytes_));
  }
  Put64(rec.data() + bytes - 8, VestigeFnv64(rec.data(), bytes - 8));
  RETURN_IF_ERROR(PwriteAll(fd_, rec.data(), bytes, kHeaderBytes + end_, path_));
  index_.emplace(page, Loc{end_, n_rows});
  end_ += bytes;
  return OkStatus();
}

Status VestigeArchiveFile::Commit() {
  if (!writable_ || end_ == committed_) return OkStatus();
  if (::fdatasync(fd_) != 0) return IoError("fdatasync of archive '" + path_ + "': " + Errno());
  const int64_t prev = committed_;
  committed_ = end_;
  Status st = WriteHeader();
  if (!st.ok()) {
    committed_ = prev;
    return st;
  }
  if (::fdatasync(fd_) != 0) return IoError("fdatasync of archive '" + path_ + "': " + Errno());
  return OkStatus();
}

Status VestigeArchiveFile::ReadRow(int64_t row, void* out) const {
  const int64_t page = row / page_rows_, i = row % page_rows_;
  auto it = index_.find(page);
  if (row < 0 || it == index_.end() || i >= it->second.n_rows) {
    return NotFound("row " + std::to_string(row) + " is not in archive '" + path_ + "'");
  }
  const int64_t off = kHeaderBytes + it->second.offset + 16 + i * (row_bytes_ + 8);
  // One pread of the row and its checksum into a small stack/heap buffer.
  std::vector<uint8_t> buf(row_bytes_ + 8);
  RETURN_IF_ERROR(PreadAll(fd_, buf.data(), row_bytes_ + 8, off, path_));
  if (Get64(buf.data() + row_bytes_) != VestigeFnv64(buf.data(), row_bytes_)) {
    return DataLoss("archive '" + path_ + "': checksum mismatch for row " + std::to_string(row) +
                    " at offset " + std::to_string(off));
  }
  std::memcpy(out, buf.data(), row_bytes_);
  return OkStatus();
}

Status VestigeArchiveFile::ReadRowRange(int64_t first, int64_t n, void* out,
                                        std::vector<int64_t>* bad) const {
  auto* dst = static_cast<uint8_t*>(out);
  auto all_bad = [&](Status s) {
    std::memset(dst, 0, static_cast<size_t>(std::max<int64_t>(n, 0) * row_bytes_));
    for (int64_t i = 0; i < n; ++i) bad->push_back(first + i);
    return s;
  };
  if (n <= 0) return OkStatus();
  const int64_t page = first / page_rows_, i0 = first % page_rows_;
  auto it = first < 0 ? index_.end() : index_.find(page);
  if (it == index_.end() || i0 + n > it->second.n_rows) {
    return all_bad(NotFound("rows [" + std::to_string(first) + ", " + std::to_string(first + n) +
                            ") are not in archive '" + path_ + "'"));
  }
  const int64_t stride = row_bytes_ + 8;
  const int64_t off = kHeaderBytes + it->second.offset + 16 + i0 * stride;
  std::vector<uint8_t> buf(static_cast<size_t>(n * stride));
  Status s = PreadAll(fd_, buf.data(), n * stride, off, path_);
  if (!s.ok()) return all_bad(s);
  Status first_error;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* src = buf.data() + i * stride;
    uint8_t* d = dst + i * row_bytes_;
    if (Get64(src + row_bytes_) != VestigeFnv64(src, row_bytes_)) {
      std::memset(d, 0, row_bytes_);
      bad->push_back(first + i);
      if (first_error.ok()) {
        first_error = DataLoss("archive '" + path_ + "': checksum mismatch for row " +
                               std::to_string(first + i) + " at offset " +
                               std::to_string(off + i * stride));
      }
      continue;
    }
    std::memcpy(d, src, row_bytes_);
  }
  return first_error;
}

}  // namespace strata
