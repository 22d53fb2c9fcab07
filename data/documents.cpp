#include "data/documents.h"

#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "runtime/check.h"

namespace mt::data {

namespace fs = std::filesystem;

const char* splitter_name(Splitter s) {
  switch (s) {
    case Splitter::file: return "file";
    case Splitter::lines: return "lines";
    case Splitter::paragraphs: return "paragraphs";
    case Splitter::fortune: return "fortune";
    case Splitter::jsonl: return "jsonl";
  }
  return "?";
}

Splitter splitter_from_name(const std::string& s, const char* flag) {
  for (Splitter x : {Splitter::file, Splitter::lines, Splitter::paragraphs, Splitter::fortune, Splitter::jsonl})
    if (s == splitter_name(x)) return x;
  fail("%s: '%s' is not one of file|lines|paragraphs|fortune|jsonl", flag, s.c_str());
}

namespace {

bool hidden(const fs::path& p) {
  std::string n = p.filename().string();
  return !n.empty() && n[0] == '.';
}

void add_file(const fs::path& p, std::set<std::string>& seen, std::vector<InputFile>& out) {
  std::error_code ec;
  fs::path canon = fs::canonical(p, ec);
  std::string key = ec ? p.string() : canon.string();
  if (!seen.insert(key).second) return;
  if (::access(p.c_str(), R_OK) != 0) fail("%s: cannot read input file: %s", p.c_str(), std::strerror(errno));
  InputFile f;
  f.path = p.string();
  f.size = fs::file_size(p, ec);
  auto t = fs::last_write_time(p, ec);
  f.mtime_ns = ec ? 0 : int64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
  out.push_back(std::move(f));
}

// strfile(1) writes "X.dat" (a binary offset table) next to each fortune database "X".
bool fortune_index(const fs::path& p) {
  if (p.extension() != ".dat") return false;
  std::error_code ec;
  return fs::is_regular_file(fs::path(p).replace_extension(""), ec);
}

}  // namespace

std::vector<InputFile> expand_inputs(const std::vector<std::string>& inputs, Splitter splitter) {
  if (inputs.empty()) fail("--input: no input files given");
  std::vector<InputFile> out;
  std::set<std::string> seen;
  for (const std::string& in : inputs) {
    std::vector<fs::path> found;
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      auto it = fs::recursive_directory_iterator(in, fs::directory_options::skip_permission_denied, ec);
      if (ec) fail("--input %s: cannot list directory: %s", in.c_str(), ec.message().c_str());
      for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (ec) fail("--input %s: cannot list directory: %s", in.c_str(), ec.message().c_str());
        if (hidden(it->path())) {
          if (it->is_directory(ec)) it.disable_recursion_pending();
          continue;
        }
        if (it->is_regular_file(ec)) found.push_back(it->path());
      }
      std::sort(found.begin(), found.end());
    } else if (in.find_first_of("*?[") != std::string::npos) {
      glob_t g{};
      if (::glob(in.c_str(), 0, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; i++)
          if (fs::is_regular_file(g.gl_pathv[i], ec)) found.emplace_back(g.gl_pathv[i]);
      ::globfree(&g);
      std::sort(found.begin(), found.end());
      if (found.empty()) fail("--input %s: the pattern matches no files", in.c_str());
    } else if (fs::exists(in, ec)) {
      if (!fs::is_regular_file(in, ec)) fail("--input %s: not a regular file or directory", in.c_str());
      found.emplace_back(in);
    } else {
      fail("--input %s: no such file or directory", in.c_str());
    }
    for (const fs::path& p : found) {
      if (splitter == Splitter::fortune && fortune_index(p)) continue;
      add_file(p, seen, out);
    }
  }
  if (out.empty()) fail("--input: no input files found (directories were empty)");
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("%s: cannot open input file: %s", path.c_str(), std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("%s: read error", path.c_str());
  return ss.str();
}

namespace {

bool blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); });
}

void add_doc(std::string_view d, std::vector<std::string>& docs) {
  if (!blank(d)) docs.emplace_back(d);
}

// Calls f(line_without_newline, offset_of_line) for each line.
template <class F>
void for_lines(std::string_view text, F&& f) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string_view::npos ? text.size() : nl;
    f(text.substr(pos, end - pos), pos);
    pos = end + 1;
  }
}

std::string_view chomp_cr(std::string_view s) { return !s.empty() && s.back() == '\r' ? s.substr(0, s.size() - 1) : s; }

}  // namespace

void split_documents(std::string_view text, Splitter splitter, const std::string& path,
                     std::vector<std::string>& docs) {
  switch (splitter) {
    case Splitter::file:
      add_doc(text, docs);
      return;
    case Splitter::lines:
      for_lines(text, [&](std::string_view line, size_t) { add_doc(line, docs); });
      return;
    case Splitter::paragraphs:
    case Splitter::fortune: {
      // A document runs from `start` up to a separator line (blank, or "%"), newline included.
      size_t start = 0;
      for_lines(text, [&](std::string_view line, size_t at) {
        std::string_view l = chomp_cr(line);
        bool sep = splitter == Splitter::fortune ? l == "%" : blank(l);
        if (!sep) return;
        add_doc(text.substr(start, at - start), docs);
        start = std::min(text.size(), at + line.size() + 1);
      });
      add_doc(text.substr(start), docs);
      return;
    }
    case Splitter::jsonl: {
      size_t ln = 0;
      for_lines(text, [&](std::string_view line, size_t) {
        ln++;
        if (blank(line)) return;
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(line);
        } catch (const std::exception& e) {
          fail("%s:%zu: not a JSON line: %s", path.c_str(), ln, e.what());
        }
        if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
          fail("%s:%zu: a jsonl line must be an object with a \"text\" string", path.c_str(), ln);
        add_doc(j["text"].get<std::string>(), docs);
      });
      return;
    }
  }
}

}  // namespace mt::data
