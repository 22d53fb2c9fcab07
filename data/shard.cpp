#include "data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "runtime/check.h"

namespace mt::data {

static_assert(std::endian::native == std::endian::little, "shards are little-endian; add byte swaps to port");

namespace {

// Slice-by-8 tables for the reflected CRC-32 polynomial 0xEDB88320: table[0] is the classic
// byte-at-a-time table, table[k][b] is the CRC of byte b followed by k zero bytes, which lets the
// loop fold eight input bytes per iteration.
constexpr std::array<std::array<uint32_t, 256>, 8> make_crc_tables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t b = 0; b < 256; b++) {
    uint32_t c = b;
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    t[0][b] = c;
  }
  for (uint32_t b = 0; b < 256; b++)
    for (int k = 1; k < 8; k++) t[size_t(k)][b] = (t[size_t(k) - 1][b] >> 8) ^ t[0][t[size_t(k) - 1][b] & 0xff];
  return t;
}
constexpr auto kCrc = make_crc_tables();

template <class T>
void put(unsigned char* p, T v) {
  std::memcpy(p, &v, sizeof v);
}
template <class T>
T get(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

void encode_header(const ShardHeader& h, unsigned char* out) {
  std::memset(out, 0, kShardHeaderBytes);
  std::memcpy(out, kShardMagic, 8);
  put<uint32_t>(out + 8, h.version);
  put<uint32_t>(out + 12, h.token_bytes);
  put<uint32_t>(out + 16, h.vocab_size);
  put<uint32_t>(out + 20, h.eot_token);
  put<uint64_t>(out + 24, h.num_tokens);
  put<uint64_t>(out + 32, h.num_docs);
  put<uint32_t>(out + 40, h.data_crc);
  put<uint32_t>(out + 60, crc32(out, 60));
}

// Decodes and checks a header; `what` names the file in errors.
ShardHeader decode_header(const unsigned char* p, const std::string& what) {
  if (std::memcmp(p, kShardMagic, 8) != 0)
    fail("%s: not a minitrain token shard (wrong magic; expected \"MTTOKENS\")", what.c_str());
  ShardHeader h;
  h.version = get<uint32_t>(p + 8);
  if (h.version != kShardVersion)
    fail("%s: shard format version %u is not supported (this build reads version %u)", what.c_str(), h.version,
         kShardVersion);
  h.header_crc = get<uint32_t>(p + 60);
  if (crc32(p, 60) != h.header_crc) fail("%s: header checksum mismatch (header is corrupt)", what.c_str());
  h.token_bytes = get<uint32_t>(p + 12);
  h.vocab_size = get<uint32_t>(p + 16);
  h.eot_token = get<uint32_t>(p + 20);
  h.num_tokens = get<uint64_t>(p + 24);
  h.num_docs = get<uint64_t>(p + 32);
  h.data_crc = get<uint32_t>(p + 40);
  if (h.token_bytes != 2 && h.token_bytes != 4)
    fail("%s: token width %u bytes is invalid (must be 2 or 4)", what.c_str(), h.token_bytes);
  if (h.vocab_size == 0 || uint64_t(h.vocab_size) > (uint64_t(1) << (8 * h.token_bytes)))
    fail("%s: vocab size %u does not fit %u-byte tokens", what.c_str(), h.vocab_size, h.token_bytes);
  if (h.eot_token >= h.vocab_size)
    fail("%s: end-of-text token %u >= vocab size %u", what.c_str(), h.eot_token, h.vocab_size);
  if (h.num_docs > h.num_tokens || (h.num_tokens > 0 && h.num_docs == 0))
    fail("%s: %llu documents for %llu tokens is inconsistent", what.c_str(), (unsigned long long)h.num_docs,
         (unsigned long long)h.num_tokens);
  if (h.num_tokens > (uint64_t(1) << 48)) fail("%s: token count %llu is implausible", what.c_str(),
                                                (unsigned long long)h.num_tokens);
  return h;
}

void write_all(int fd, const void* p, size_t n, const std::string& path) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("%s: write failed: %s", path.c_str(), std::strerror(errno));
    c += w;
    n -= size_t(w);
  }
}

}  // namespace

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (n >= 8) {
    uint32_t lo = get<uint32_t>(p) ^ c;
    uint32_t hi = get<uint32_t>(p + 4);
    c = kCrc[7][lo & 0xff] ^ kCrc[6][(lo >> 8) & 0xff] ^ kCrc[5][(lo >> 16) & 0xff] ^ kCrc[4][lo >> 24] ^
        kCrc[3][hi & 0xff] ^ kCrc[2][(hi >> 8) & 0xff] ^ kCrc[1][(hi >> 16) & 0xff] ^ kCrc[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ kCrc[0][(c ^ *p++) & 0xff];
  return ~c;
}

uint32_t token_bytes_for_vocab(uint64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

uint64_t shard_index_offset(const ShardHeader& h) {
  uint64_t tok_bytes = h.num_tokens * h.token_bytes;
  return kShardHeaderBytes + (tok_bytes + 7) / 8 * 8;
}
uint64_t shard_file_bytes(const ShardHeader& h) { return shard_index_offset(h) + 8 * h.num_docs; }

void write_shard(const std::string& path, std::span<const int32_t> tokens, std::span<const uint64_t> doc_starts,
                 uint32_t vocab_size, uint32_t eot_token, uint32_t token_bytes) {
  ShardHeader h;
  h.token_bytes = token_bytes ? token_bytes : token_bytes_for_vocab(vocab_size);
  h.vocab_size = vocab_size;
  h.eot_token = eot_token;
  h.num_tokens = tokens.size();
  h.num_docs = doc_starts.size();
  MT_CHECK(h.token_bytes == 2 || h.token_bytes == 4, "%s: token width %u", path.c_str(), h.token_bytes);
  MT_CHECK(vocab_size > 0 && uint64_t(vocab_size) <= (uint64_t(1) << (8 * h.token_bytes)),
           "%s: vocab %u does not fit %u-byte tokens", path.c_str(), vocab_size, h.token_bytes);
  MT_CHECK(eot_token < vocab_size, "%s: eot %u >= vocab %u", path.c_str(), eot_token, vocab_size);
  MT_CHECK(tokens.empty() ? doc_starts.empty() : (!doc_starts.empty() && doc_starts[0] == 0),
           "%s: the document index must start at token 0", path.c_str());
  for (size_t i = 1; i < doc_starts.size(); i++)
    MT_CHECK(doc_starts[i] > doc_starts[i - 1] && doc_starts[i] < tokens.size(),
             "%s: document start %zu is out of order or range", path.c_str(), i);

  // Body = tokens at their width, zero padding to 8 bytes, then the u64 index.
  std::vector<unsigned char> body(shard_index_offset(h) - kShardHeaderBytes + 8 * h.num_docs, 0);
  for (size_t i = 0; i < tokens.size(); i++) {
    int32_t t = tokens[i];
    if (t < 0 || uint32_t(t) >= vocab_size)
      fail("%s: token id %d at position %zu is outside the vocabulary [0, %u)", path.c_str(), t, i, vocab_size);
    if (h.token_bytes == 2)
      put<uint16_t>(body.data() + 2 * i, uint16_t(t));
    else
      put<uint32_t>(body.data() + 4 * i, uint32_t(t));
  }
  if (!doc_starts.empty())
    std::memcpy(body.data() + (shard_index_offset(h) - kShardHeaderBytes), doc_starts.data(), 8 * doc_starts.size());
  h.data_crc = crc32(body.data(), body.size());
  unsigned char head[kShardHeaderBytes];
  encode_header(h, head);

  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("%s: cannot create: %s", tmp.c_str(), std::strerror(errno));
  try {
    write_all(fd, head, sizeof head, tmp);
    write_all(fd, body.data(), body.size(), tmp);
    if (::fsync(fd) != 0) fail("%s: fsync failed: %s", tmp.c_str(), std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    fail("%s: cannot rename the finished shard into place: %s", path.c_str(), std::strerror(e));
  }
}

void ShardBuilder::add_document(std::span<const int32_t> tokens) {
  doc_starts_.push_back(tokens_.size());
  tokens_.push_back(int32_t(eot_));
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
}

void ShardBuilder::write(const std::string& path) {
  write_shard(path, tokens_, doc_starts_, vocab_size_, eot_);
  tokens_.clear();
  doc_starts_.clear();
}

ShardHeader read_shard_header(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("%s: cannot open shard: %s", path.c_str(), std::strerror(errno));
  unsigned char head[kShardHeaderBytes];
  size_t got = std::fread(head, 1, sizeof head, f);
  std::fclose(f);
  if (got != sizeof head)
    fail("%s: truncated shard (%zu bytes, shorter than the %zu-byte header)", path.c_str(), got, kShardHeaderBytes);
  return decode_header(head, path);
}

Shard::Shard(const std::string& path, bool verify_data) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("%s: cannot open shard: %s", path.c_str(), std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail("%s: cannot stat shard: %s", path.c_str(), std::strerror(errno));
  }
  size_t size = size_t(st.st_size);
  if (size < kShardHeaderBytes) {
    ::close(fd);
    fail("%s: truncated shard (%zu bytes, shorter than the %zu-byte header)", path.c_str(), size, kShardHeaderBytes);
  }
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) fail("%s: cannot map shard: %s", path.c_str(), std::strerror(errno));
  map_ = static_cast<const unsigned char*>(m);
  map_bytes_ = size;
  try {
    h_ = decode_header(map_, path);
    uint64_t want = shard_file_bytes(h_);
    if (size < want)
      fail("%s: truncated shard (%zu bytes, the header promises %llu)", path.c_str(), size, (unsigned long long)want);
    if (size > want)
      fail("%s: %zu trailing bytes after the document index", path.c_str(), size_t(size - want));
    tokens_ = map_ + kShardHeaderBytes;
    index_ = reinterpret_cast<const uint64_t*>(map_ + shard_index_offset(h_));  // 8-aligned by the padding
    if (verify_data && crc32(map_ + kShardHeaderBytes, size - kShardHeaderBytes) != h_.data_crc)
      fail("%s: data checksum mismatch (tokens or document index are corrupt)", path.c_str());
    if (h_.num_docs > 0 && index_[0] != 0) fail("%s: the document index does not start at token 0", path.c_str());
    for (uint64_t i = 1; i < h_.num_docs; i++)
      if (index_[i] <= index_[i - 1] || index_[i] >= h_.num_tokens)
        fail("%s: document index entry %llu is out of order or range", path.c_str(), (unsigned long long)i);
    if (verify_data && uint64_t(h_.vocab_size) < (uint64_t(1) << (8 * h_.token_bytes))) {
      uint32_t max_id = 0;
      uint64_t at = 0;
      for (uint64_t i = 0; i < h_.num_tokens; i++) {
        uint32_t t = h_.token_bytes == 2 ? get<uint16_t>(tokens_ + 2 * i) : get<uint32_t>(tokens_ + 4 * i);
        if (t > max_id) max_id = t, at = i;
      }
      if (h_.num_tokens > 0 && max_id >= h_.vocab_size)
        fail("%s: token id %u at position %llu is >= the vocab size %u", path.c_str(), max_id,
             (unsigned long long)at, h_.vocab_size);
    }
  } catch (...) {
    ::munmap(const_cast<unsigned char*>(map_), map_bytes_);
    throw;
  }
}

Shard::~Shard() {
  if (map_) ::munmap(const_cast<unsigned char*>(map_), map_bytes_);
}

int32_t Shard::token(uint64_t i) const {
  return int32_t(h_.token_bytes == 2 ? get<uint16_t>(tokens_ + 2 * i) : get<uint32_t>(tokens_ + 4 * i));
}

void Shard::read(uint64_t begin, uint64_t n, int32_t* out) const {
  MT_CHECK(begin + n <= h_.num_tokens, "%s: read [%llu, %llu) past %llu tokens", path_.c_str(),
           (unsigned long long)begin, (unsigned long long)(begin + n), (unsigned long long)h_.num_tokens);
  if (h_.token_bytes == 2) {
    const unsigned char* p = tokens_ + 2 * begin;
    for (uint64_t k = 0; k < n; k++) out[k] = int32_t(get<uint16_t>(p + 2 * k));
  } else {
    std::memcpy(out, tokens_ + 4 * begin, 4 * n);
  }
}

}  // namespace mt::data
