// CRC-32C (the Castagnoli polynomial 0x1EDC6F41, bit-reflected form 0x82F63B78; Castagnoli, Braeuer
// and Herrmann 1993), the checksum of every stored byte of a checkpoint.
//
// CRC-32C rather than the zlib CRC-32 because x86-64 has an instruction for it (SSE4.2 `crc32`, part
// of the x86-64-v2 baseline this project builds for), so checksumming a 1.5 GB checkpoint costs a
// fraction of a second rather than several seconds. Without SSE4.2 a slice-by-8 table version runs.
//
// Convention (the common one, e.g. iSCSI, ext4): initial value ~0, final xor ~0, so
// crc32c("123456789") == 0xE3069283. `crc` continues a previous result:
//   crc32c(ab, na + nb) == crc32c(b, nb, crc32c(a, na)).
#pragma once
#include <cstddef>
#include <cstdint>

namespace mt::checkpoint {

uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

// The table-driven implementation, always compiled (the tests check both agree).
uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc = 0);

}  // namespace mt::checkpoint
