// CRC-32C, the checksum of every checkpoint byte: the standard check values, the hardware and table
// implementations agreeing on random data of every alignment, and continuation over split buffers.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/crc32c.h"
#include "tests/test_util.h"

namespace mt::checkpoint {
namespace {

// Check values from RFC 3720 (iSCSI), appendix B.4, and the common "123456789" check.
TEST(Crc32c, MatchesTheStandardCheckValues) {
  const std::string digits = "123456789";
  EXPECT_EQ(crc32c(digits.data(), digits.size()), 0xE3069283u);
  EXPECT_EQ(crc32c_portable(digits.data(), digits.size()), 0xE3069283u);
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xff), inc(32), dec(32);
  for (int i = 0; i < 32; i++) {
    inc[size_t(i)] = (unsigned char)i;
    dec[size_t(i)] = (unsigned char)(31 - i);
  }
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(inc.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c(dec.data(), 32), 0x113FDB5Cu);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

TEST(Crc32c, HardwareAndTableVersionsAgreeOnRandomData) {
  std::mt19937_64 rng(testing::test_seed());
  std::vector<unsigned char> buf(4096 + 16);
  for (auto& b : buf) b = (unsigned char)rng();
  for (int trial = 0; trial < 200; trial++) {
    const size_t off = rng() % 16, n = rng() % 4096;  // every alignment and tail length
    EXPECT_EQ(crc32c(buf.data() + off, n), crc32c_portable(buf.data() + off, n)) << "offset " << off << " length " << n;
  }
}

TEST(Crc32c, ContinuesAcrossSplitBuffers) {
  std::mt19937_64 rng(testing::test_seed() + 1);
  std::vector<unsigned char> buf(10000);
  for (auto& b : buf) b = (unsigned char)rng();
  const uint32_t whole = crc32c(buf.data(), buf.size());
  for (int trial = 0; trial < 50; trial++) {
    const size_t cut = rng() % buf.size();
    EXPECT_EQ(crc32c(buf.data() + cut, buf.size() - cut, crc32c(buf.data(), cut)), whole);
    EXPECT_EQ(crc32c_portable(buf.data() + cut, buf.size() - cut, crc32c_portable(buf.data(), cut)), whole);
  }
}

TEST(Crc32c, DetectsEverySingleBitFlip) {
  std::mt19937_64 rng(testing::test_seed() + 2);
  std::vector<unsigned char> buf(257);
  for (auto& b : buf) b = (unsigned char)rng();
  const uint32_t good = crc32c(buf.data(), buf.size());
  for (size_t bit = 0; bit < buf.size() * 8; bit++) {
    buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
    ASSERT_NE(crc32c(buf.data(), buf.size()), good) << "bit " << bit;
    buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
  }
}

}  // namespace
}  // namespace mt::checkpoint
