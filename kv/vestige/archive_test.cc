#include "kv/vestige/archive.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/rng.h"

namespace strata {
namespace {

std::string TempDir() {
  const std::string d = std::filesystem::temp_directory_path() /
                        ("strata_vestige_archive_" + std::to_string(getpid()));
  std::filesystem::create_directories(d);
  return d;
}

std::vector<char> ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}
void WriteAll(const std::string& path, const std::vector<char>& b, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(b.data(), static_cast<std::streamsize>(n));
}

// Writes random pages (random page ids, some partial), commits, and checks every row reads back
// byte for byte from the writer and from a fresh Open.
TEST(VestigeArchiveTest, RoundTripByteForByte) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const std::string path = TempDir() + "/roundtrip.arc";
  const int64_t row_bytes = 2 * (8 + rng.Below(64)), page_rows = 64;
  auto f = VestigeArchiveFile::Create(path, row_bytes, page_rows);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::map<int64_t, std::vector<uint8_t>> pages;
  std::map<int64_t, int64_t> n_of;
  for (int i = 0; i < 12; ++i) {
    int64_t p;
    do p = rng.Below(100);
    while (pages.count(p));
    const int64_t n = rng.Below(3) == 0 ? 1 + rng.Below(page_rows) : page_rows;
    std::vector<uint8_t> b(n * row_bytes);
    for (auto& x : b) x = static_cast<uint8_t>(rng.Next());
    ASSERT_TRUE(f->AppendPage(p, b.data(), n).ok());
    pages[p] = b;
    n_of[p] = n;
    if (i % 5 == 4) {
      ASSERT_TRUE(f->Commit().ok());
    }
  }
  ASSERT_TRUE(f->Commit().ok());
  const int64_t p0 = pages.begin()->first;
  EXPECT_EQ(f->AppendPage(p0, pages[p0].data(), 1).code(), StatusCode::kInvalidArgument);
  auto check = [&](const VestigeArchiveFile& a) {
    std::vector<uint8_t> out(row_bytes);
    for (const auto& [p, b] : pages) {
      for (int64_t i = 0; i < n_of[p]; ++i) {
        ASSERT_TRUE(a.ReadRow(p * page_rows + i, out.data()).ok());
        ASSERT_EQ(0, std::memcmp(out.data(), b.data() + i * row_bytes, row_bytes));
      }
      if (n_of[p] < page_rows) {
        EXPECT_EQ(a.ReadRow(p * page_rows + n_of[p], out.data()).code(), StatusCode::kNotFound);
      }
    }
    EXPECT_EQ(a.ReadRow(100 * page_rows, out.data()).code(), StatusCode::kNotFound);
  };
  check(*f);
  auto g = VestigeArchiveFile::Open(path);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->n_records(), 12);
  EXPECT_EQ(g->row_bytes(), row_bytes);
  check(*g);
  std::filesystem::remove(path);
}

// A file cut at any offset, or with any single byte flipped, is DataLoss on Open (never rows);
// uncommitted appended bytes (a crash before the header write) are ignored; a row corrupted
// under an open reader is DataLoss on ReadRow.
TEST(VestigeArchiveTest, TruncationAndCorruptionAreDataLoss) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const std::string dir = TempDir();
  const std::string path = dir + "/good.arc", bad = dir + "/bad.arc";
  const int64_t row_bytes = 80, page_rows = 64;
  {
    auto f = VestigeArchiveFile::Create(path, row_bytes, page_rows);
    ASSERT_TRUE(f.ok());
    std::vector<uint8_t> b(page_rows * row_bytes);
    for (int p = 0; p < 4; ++p) {
      for (auto& x : b) x = static_cast<uint8_t>(rng.Next());
      ASSERT_TRUE(f->AppendPage(p, b.data(), page_rows).ok());
    }
    ASSERT_TRUE(f->Commit().ok());
  }
  const std::vector<char> good = ReadAll(path);
  ASSERT_TRUE(VestigeArchiveFile::Open(path).ok());
  for (int t = 0; t < 60; ++t) {
    const size_t cut = t == 0 ? 0 : rng.Below(good.size());
    WriteAll(bad, good, cut);
    auto r = VestigeArchiveFile::Open(bad);
    ASSERT_FALSE(r.ok()) << "cut at " << cut;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
  }
  for (int t = 0; t < 200; ++t) {
    std::vector<char> b = good;
    const size_t at = t < 48 ? t : rng.Below(b.size());  // every header byte, then anywhere
    b[at] ^= static_cast<char>(1 + rng.Below(255));
    WriteAll(bad, b, b.size());
    auto r = VestigeArchiveFile::Open(bad);
    ASSERT_FALSE(r.ok()) << "flip at " << at;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
  }
  // Crash after writing a record but before committing it: the committed part opens.
  {
    auto f = VestigeArchiveFile::Create(bad, row_bytes, page_rows);
    std::vector<uint8_t> b(page_rows * row_bytes, 7);
    ASSERT_TRUE(f->AppendPage(0, b.data(), page_rows).ok());
    ASSERT_TRUE(f->Commit().ok());
    ASSERT_TRUE(f->AppendPage(1, b.data(), page_rows / 2).ok());  // never committed
  }
  {
    auto r = VestigeArchiveFile::Open(bad);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->n_records(), 1);
    EXPECT_FALSE(r->HasPage(1));
  }
  // Corruption after Open: the per-row checksum catches it.
  {
    WriteAll(bad, good, good.size());
    auto r = VestigeArchiveFile::Open(bad);
    ASSERT_TRUE(r.ok());
    std::vector<char> b = good;
    const size_t row_off = VestigeArchiveFile::kHeaderBytes + 16 + 5 * (row_bytes + 8) + 3;
    b[row_off] ^= 0x10;
    WriteAll(bad, b, b.size());  // same inode? ofstream truncates in place: yes
    std::vector<uint8_t> out(row_bytes);
    EXPECT_EQ(r->ReadRow(5, out.data()).code(), StatusCode::kDataLoss);
    EXPECT_TRUE(r->ReadRow(6, out.data()).ok());
  }
  EXPECT_EQ(VestigeArchiveFile::Open(dir + "/missing.arc").status().code(), StatusCode::kIoError);
  std::filesystem::remove(path);
  std::filesystem::remove(bad);
}

// D6 (issue 13, found by the fuzzer): a record's size, 16 + n_rows * (row_bytes + 8) + 8, from
// u32 header fields overflowed to a negative count that passed the length check, and
// rec.resize(negative) threw and aborted. A 150-byte file built here: a header with a valid
// checksum claiming 2^32 - 1 byte rows in 2^32 - 1 row pages, and one record of 2^31 rows.
TEST(VestigeArchiveTest, HugeHeaderFieldsAreRefusedNotOverflowed) {
  const std::string dir = TempDir();
  const std::string path = dir + "/huge.arc";
  auto put32 = [](uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); };
  auto put64 = [](uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); };
  for (const auto& [row_bytes, page_rows] :
       std::vector<std::pair<uint32_t, uint32_t>>{{0xFFFFFFFFu, 0xFFFFFFFFu},
                                                   {64, 0xFFFFFFFFu},
                                                   {0xFFFFFFFFu, 64},
                                                   {(1u << 20) + 1, 64}}) {
    std::vector<uint8_t> b(150, 0);
    std::memcpy(b.data(), "STRVARC1", 8);
    put32(&b[8], VestigeArchiveFile::kVersion);
    put32(&b[12], row_bytes);
    put32(&b[16], page_rows);
    put64(&b[24], 150 - VestigeArchiveFile::kHeaderBytes);  // committed
    put64(&b[32], 1);                                       // one record
    put64(&b[40], VestigeFnv64(b.data(), 40));
    put64(&b[48], 0);             // page 0
    put32(&b[56], 0x80000000u);   // n_rows
    WriteAll(path, std::vector<char>(b.begin(), b.end()), b.size());
    auto r = VestigeArchiveFile::Open(path);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
    EXPECT_NE(r.status().message().find("bad header fields"), std::string::npos)
        << r.status().message();
  }
  // The writer refuses the same sizes.
  EXPECT_EQ(VestigeArchiveFile::Create(path, int64_t{1} << 21, 64).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(VestigeArchiveFile::Create(path, 64, int64_t{1} << 17).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(VestigeArchiveFile::Create(path, VestigeArchiveFile::kMaxRowBytes,
                                         VestigeArchiveFile::kMaxPageRows)
                  .ok());
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace strata
