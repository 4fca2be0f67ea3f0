// SHA-256 (FIPS 180-4) of a byte buffer, incremental or one-shot; used to compare test data by
// digest.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace strata {

class Sha256 {
 public:
  Sha256();
  // Feeds `n` bytes; may be called any number of times before Finish.
  void Update(const void* data, size_t n);
  // The digest of everything fed; the object must not be updated afterwards.
  std::array<uint8_t, 32> Finish();

  // One-shot digest as 64 lowercase hex characters.
  static std::string Hex(const void* data, size_t n);

 private:
  void Block(const uint8_t* p);

  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;  // bytes fed
};

}  // namespace strata
