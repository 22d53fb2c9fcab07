#include "data/tokenizer.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>

#include "data/pretokenize.h"
#include "data/sampler.h"
#include "runtime/check.h"

namespace mt::data {

namespace fs = std::filesystem;

namespace {

constexpr size_t kHeapPieceBytes = 64;  // longer pieces use the O(n log n) merge loop
constexpr size_t kCachePieceBytes = 64;

uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

// GPT-2's reversible byte -> printable code point map: printable Latin-1 bytes keep their code
// point, the other 68 bytes are moved to U+0100 upward in byte order, so every token is a string of
// printable characters in vocab.json and merges.txt.
std::array<uint32_t, 256> gpt2_byte_to_cp() {
  std::array<uint32_t, 256> m{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; b++) {
    bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    m[b] = keep ? b : next++;
  }
  return m;
}

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
}

std::string read_text_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("%s: cannot read %s", path.c_str(), what);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json parse_json_file(const std::string& path, const char* what) {
  std::string text = read_text_file(path, what);
  try {
    return nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail("%s: %s is not valid JSON: %s", path.c_str(), what, e.what());
  }
}

}  // namespace

const std::vector<int32_t>* EncodeCache::find(std::string_view piece) const {
  auto it = map_.find(piece);
  return it == map_.end() ? nullptr : &it->second;
}

void EncodeCache::insert(std::string_view piece, const std::vector<int32_t>& ids) {
  if (map_.size() >= max_entries_) map_.clear();
  map_.emplace(std::string(piece), ids);
}

Tokenizer::Tokenizer(std::array<int32_t, 256> byte_ids, std::vector<Merge> merges, int32_t eot_token,
                     int vocab_size, const std::string& origin)
    : byte_ids_(byte_ids), merges_(std::move(merges)), eot_(eot_token), vocab_size_(vocab_size) {
  const char* o = origin.c_str();
  if (vocab_size_ <= 256) fail("%s: vocab size %d must exceed the 256 byte tokens", o, vocab_size_);
  if (size_t(vocab_size_) != 257 + merges_.size())
    fail("%s: vocab size %d != 256 bytes + %zu merges + end-of-text", o, vocab_size_, merges_.size());
  if (eot_ < 0 || eot_ >= vocab_size_) fail("%s: end-of-text id %d outside [0, %d)", o, eot_, vocab_size_);
  bytes_.assign(size_t(vocab_size_), std::string());
  std::vector<char> defined(size_t(vocab_size_), 0);
  defined[size_t(eot_)] = 1;
  for (int b = 0; b < 256; b++) {
    int32_t id = byte_ids_[size_t(b)];
    if (id < 0 || id >= vocab_size_ || defined[size_t(id)])
      fail("%s: byte %d has id %d, which is out of range or already used", o, b, id);
    defined[size_t(id)] = 1;
    bytes_[size_t(id)] = std::string(1, char(b));
  }
  rank_.reserve(merges_.size() * 2);
  for (size_t i = 0; i < merges_.size(); i++) {
    const Merge& m = merges_[i];
    auto ok = [&](int32_t id) { return id >= 0 && id < vocab_size_ && defined[size_t(id)] && id != eot_; };
    if (!ok(m.left) || !ok(m.right))
      fail("%s: merge %zu (%d, %d) uses a token not defined by the bytes or an earlier merge", o, i, m.left,
           m.right);
    if (m.result < 0 || m.result >= vocab_size_ || defined[size_t(m.result)])
      fail("%s: merge %zu produces id %d, which is out of range or already used", o, i, m.result);
    if (!rank_.emplace(pair_key(m.left, m.right), (uint64_t(i) << 32) | uint32_t(m.result)).second)
      fail("%s: merge %zu (%d, %d) is listed twice", o, i, m.left, m.right);
    defined[size_t(m.result)] = 1;
    bytes_[size_t(m.result)] = bytes_[size_t(m.left)] + bytes_[size_t(m.right)];
  }
}

bool Tokenizer::find_merge(int32_t left, int32_t right, uint32_t& rank, int32_t& result) const {
  auto it = rank_.find(pair_key(left, right));
  if (it == rank_.end()) return false;
  rank = uint32_t(it->second >> 32);
  result = int32_t(uint32_t(it->second));
  return true;
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out, bool heap) const {
  const size_t n = piece.size();
  if (!heap) {
    // Repeatedly find the lowest-ranked adjacent pair and merge all its occurrences left to right.
    std::vector<int32_t> ids(n);
    for (size_t i = 0; i < n; i++) ids[i] = byte_ids_[uint8_t(piece[i])];
    while (ids.size() >= 2) {
      uint32_t best = UINT32_MAX, r;
      int32_t best_result = -1, res;
      for (size_t i = 0; i + 1 < ids.size(); i++)
        if (find_merge(ids[i], ids[i + 1], r, res) && r < best) best = r, best_result = res;
      if (best_result < 0) break;
      const Merge& m = merges_[best];
      size_t j = 0;
      for (size_t i = 0; i < ids.size(); j++) {
        if (i + 1 < ids.size() && ids[i] == m.left && ids[i + 1] == m.right) {
          ids[j] = best_result;
          i += 2;
        } else {
          ids[j] = ids[i++];
        }
      }
      ids.resize(j);
    }
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  // Linked list of symbols plus a min-heap of candidate merges keyed by (rank, position). Equal
  // ranks pop leftmost first and a merge only creates pairs of higher rank (its result did not exist
  // before), so this applies merges in exactly the order of the loop above.
  std::vector<int32_t> id(n), prev(n), next(n);
  for (size_t i = 0; i < n; i++) {
    id[i] = byte_ids_[uint8_t(piece[i])];
    prev[i] = int32_t(i) - 1;
    next[i] = i + 1 < n ? int32_t(i + 1) : -1;
  }
  using Cand = std::pair<uint64_t, uint64_t>;  // (rank << 32 | pos, left << 32 | right)
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> q;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[size_t(pos)] < 0) return;
    uint32_t r;
    int32_t res;
    int32_t a = id[size_t(pos)], b = id[size_t(next[size_t(pos)])];
    if (find_merge(a, b, r, res)) q.push({(uint64_t(r) << 32) | uint32_t(pos), pair_key(a, b)});
  };
  for (size_t i = 0; i + 1 < n; i++) push(int32_t(i));
  std::vector<char> alive(n, 1);
  while (!q.empty()) {
    auto [key, pair] = q.top();
    q.pop();
    int32_t pos = int32_t(uint32_t(key));
    int32_t nx = next[size_t(pos)];
    if (!alive[size_t(pos)] || nx < 0 || pair_key(id[size_t(pos)], id[size_t(nx)]) != pair) continue;  // stale
    id[size_t(pos)] = merges_[key >> 32].result;
    alive[size_t(nx)] = 0;
    next[size_t(pos)] = next[size_t(nx)];
    if (next[size_t(nx)] >= 0) prev[size_t(next[size_t(nx)])] = pos;
    push(prev[size_t(pos)]);
    push(pos);
  }
  for (int32_t p = n ? 0 : -1; p >= 0; p = next[size_t(p)]) out.push_back(id[size_t(p)]);
}

void Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out, EncodeCache& cache) const {
  std::vector<std::string_view> pieces;
  pretokenize(text, pieces);
  std::vector<int32_t> ids;
  for (std::string_view p : pieces) {
    if (p.size() <= kCachePieceBytes) {
      if (const auto* hit = cache.find(p)) {
        out.insert(out.end(), hit->begin(), hit->end());
        continue;
      }
    }
    ids.clear();
    encode_piece(p, ids, p.size() > kHeapPieceBytes);
    if (p.size() <= kCachePieceBytes) cache.insert(p, ids);
    out.insert(out.end(), ids.begin(), ids.end());
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  EncodeCache cache;
  std::vector<int32_t> out;
  encode_append(text, out, cache);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string s;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_) fail("cannot decode token id %d: outside the vocabulary [0, %d)", id, vocab_size_);
    if (id == eot_)
      s += kEotText;
    else
      s += bytes_[size_t(id)];
  }
  return s;
}

uint64_t Tokenizer::fingerprint() const {
  uint64_t h = hash_words({uint64_t(vocab_size_), uint64_t(eot_)});
  for (int32_t b : byte_ids_) h = mix64(h ^ uint64_t(b));
  for (const Merge& m : merges_) h = hash_words({h, uint64_t(m.left), uint64_t(m.right), uint64_t(m.result)});
  return h;
}

void Tokenizer::save(const std::string& path, const nlohmann::json& provenance) const {
  nlohmann::json j;
  j["format"] = "minitrain-bpe";
  j["version"] = 1;
  j["pretokenizer"] = "gpt2";
  j["vocab_size"] = vocab_size_;
  j["eot_token"] = eot_;
  j["byte_ids"] = byte_ids_;
  nlohmann::json m = nlohmann::json::array();
  for (const Merge& x : merges_) m.push_back({x.left, x.right, x.result});
  j["merges"] = std::move(m);
  if (!provenance.is_null()) j["provenance"] = provenance;
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("%s: cannot write the tokenizer", tmp.c_str());
    out << j.dump() << "\n";
    if (!out.flush()) fail("%s: write failed", tmp.c_str());
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail("%s: cannot rename the tokenizer into place", path.c_str());
  }
}

Tokenizer Tokenizer::load(const std::string& path) {
  nlohmann::json j = parse_json_file(path, "tokenizer file");
  try {
    if (!j.is_object() || j.value("format", "") != "minitrain-bpe")
      fail("%s: not a minitrain tokenizer (format is not \"minitrain-bpe\")", path.c_str());
    if (j.at("version").get<int>() != 1)
      fail("%s: tokenizer version %d is not supported", path.c_str(), j.at("version").get<int>());
    std::array<int32_t, 256> bytes{};
    const auto& b = j.at("byte_ids");
    if (!b.is_array() || b.size() != 256) fail("%s: byte_ids must list 256 ids", path.c_str());
    for (size_t i = 0; i < 256; i++) bytes[i] = b[i].get<int32_t>();
    std::vector<Merge> merges;
    for (const auto& m : j.at("merges")) {
      if (!m.is_array() || m.size() != 3) fail("%s: each merge must be [left, right, result]", path.c_str());
      merges.push_back({m[0].get<int32_t>(), m[1].get<int32_t>(), m[2].get<int32_t>()});
    }
    return Tokenizer(bytes, std::move(merges), j.at("eot_token").get<int32_t>(), j.at("vocab_size").get<int>(),
                     path);
  } catch (const nlohmann::json::exception& e) {
    fail("%s: malformed tokenizer file: %s", path.c_str(), e.what());
  }
}

Tokenizer Tokenizer::load_gpt2(const std::string& vocab_json, const std::string& merges_txt) {
  nlohmann::json vocab = parse_json_file(vocab_json, "GPT-2 vocab.json");
  if (!vocab.is_object()) fail("%s: a GPT-2 vocab.json must be an object of token -> id", vocab_json.c_str());
  std::array<uint32_t, 256> to_cp = gpt2_byte_to_cp();
  std::unordered_map<std::string, int32_t> ids;
  int32_t eot = -1, max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer()) fail("%s: id of '%s' is not an integer", vocab_json.c_str(), it.key().c_str());
    int32_t id = it.value().get<int32_t>();
    if (it.key() == kEotText) eot = id;
    ids[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  if (eot < 0) fail("%s: no \"%s\" entry", vocab_json.c_str(), std::string(kEotText).c_str());
  std::array<int32_t, 256> byte_ids{};
  for (uint32_t b = 0; b < 256; b++) {
    std::string s;
    append_utf8(s, to_cp[b]);
    auto it = ids.find(s);
    if (it == ids.end()) fail("%s: no token for byte %u", vocab_json.c_str(), b);
    byte_ids[b] = it->second;
  }
  std::ifstream in(merges_txt);
  if (!in) fail("%s: cannot read GPT-2 merges.txt", merges_txt.c_str());
  std::vector<Merge> merges;
  std::string line;
  for (size_t ln = 1; std::getline(in, line); ln++) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (ln == 1 && line.rfind("#version", 0) == 0)) continue;
    size_t sp = line.find(' ');
    if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
      fail("%s:%zu: expected two tokens separated by one space", merges_txt.c_str(), ln);
    std::string a = line.substr(0, sp), b = line.substr(sp + 1);
    auto ia = ids.find(a), ib = ids.find(b), ir = ids.find(a + b);
    if (ia == ids.end() || ib == ids.end() || ir == ids.end())
      fail("%s:%zu: merge '%s %s' uses or makes a token missing from %s", merges_txt.c_str(), ln, a.c_str(),
           b.c_str(), vocab_json.c_str());
    merges.push_back({ia->second, ib->second, ir->second});
  }
  return Tokenizer(byte_ids, std::move(merges), eot, max_id + 1, vocab_json);
}

Tokenizer Tokenizer::load_any(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    fs::path d(path);
    if (fs::exists(d / "tokenizer.json")) return load((d / "tokenizer.json").string());
    if (fs::exists(d / "vocab.json") && fs::exists(d / "merges.txt"))
      return load_gpt2((d / "vocab.json").string(), (d / "merges.txt").string());
    fail("%s: holds neither tokenizer.json nor vocab.json + merges.txt", path.c_str());
  }
  if (!fs::exists(path, ec)) fail("%s: no such tokenizer file", path.c_str());
  nlohmann::json j = parse_json_file(path, "tokenizer file");
  if (j.is_object() && j.contains("format")) return load(path);
  fs::path merges = fs::path(path).parent_path() / "merges.txt";
  if (!fs::exists(merges)) fail("%s: looks like a GPT-2 vocab.json but %s is missing", path.c_str(), merges.c_str());
  return load_gpt2(path, merges.string());
}

}  // namespace mt::data
