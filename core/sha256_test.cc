// SHA-256 against the FIPS 180-2 / NIST example vectors, and incremental feeding against one shot.
#include "core/sha256.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace strata {
namespace {

std::string HexOf(const std::string& s) { return Sha256::Hex(s.data(), s.size()); }

TEST(Sha256Test, StandardVectors) {
  EXPECT_EQ(HexOf(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(HexOf("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(HexOf("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(HexOf("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopq"
                  "klmnopqrlmnopqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(HexOf(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Padding edge cases: lengths around the 56-byte boundary where the length field spills into a
// second block.
TEST(Sha256Test, PaddingBoundaries) {
  EXPECT_EQ(HexOf(std::string(55, 'a')),
            "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(HexOf(std::string(56, 'a')),
            "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  EXPECT_EQ(HexOf(std::string(64, 'a')),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST(Sha256Test, IncrementalEqualsOneShot) {
  std::vector<uint8_t> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 131 + 7);
  const std::string whole = Sha256::Hex(data.data(), data.size());
  for (size_t step : {1, 3, 63, 64, 65, 200}) {
    Sha256 s;
    for (size_t i = 0; i < data.size(); i += step) {
      s.Update(data.data() + i, std::min(step, data.size() - i));
    }
    const auto d = s.Finish();
    std::string hex;
    for (uint8_t b : d) {
      static const char kHex[] = "0123456789abcdef";
      hex += kHex[b >> 4];
      hex += kHex[b & 15];
    }
    EXPECT_EQ(hex, whole) << "step " << step;
  }
}

}  // namespace
}  // namespace strata
