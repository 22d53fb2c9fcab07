// Finding input files and cutting them into documents for `data prepare`.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mt::data {

// How a file is cut into documents:
//   file       the whole file is one document;
//   lines      every non-blank line is a document;
//   paragraphs blocks separated by blank lines;
//   fortune    the fortune(6) database format: documents separated by lines holding only "%";
//   jsonl      one JSON object per line, the document is its "text" string.
// Documents that are empty or only whitespace are dropped.
enum class Splitter { file, lines, paragraphs, fortune, jsonl };
const char* splitter_name(Splitter s);
Splitter splitter_from_name(const std::string& s, const char* flag = "--splitter");

struct InputFile {
  std::string path;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
};

// Files named by `inputs` (files, directories searched recursively, glob patterns), in the order
// given, directory contents sorted by name, each file once (symlinks to the same file collapse).
// Hidden files are skipped inside directories. In fortune mode the strfile(1) index "X.dat" next to a
// database "X" is skipped. Fails naming the input that matches nothing or cannot be read.
std::vector<InputFile> expand_inputs(const std::vector<std::string>& inputs, Splitter splitter);

// Reads a whole file; fails naming it when it cannot be read.
std::string read_file(const std::string& path);

// Appends the documents of `text` (read from `path`, named in errors) to `docs`.
void split_documents(std::string_view text, Splitter splitter, const std::string& path,
                     std::vector<std::string>& docs);

}  // namespace mt::data
