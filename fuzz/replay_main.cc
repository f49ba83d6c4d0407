// main() for fuzz targets in plain builds (no libFuzzer): runs LLVMFuzzerTestOneInput once on every
// file of the directories given, so the seed corpus is a regression test under gcc too. Arguments
// starting with '-' are libFuzzer's flags and are ignored.
#include <dirent.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  int replayed = 0;
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] == '-') continue;
    DIR* dir = opendir(argv[i]);
    if (!dir) {
      std::fprintf(stderr, "replay: cannot open directory %s\n", argv[i]);
      return 1;
    }
    std::vector<std::string> files;
    while (const dirent* entry = readdir(dir))
      if (entry->d_name[0] != '.') files.push_back(std::string(argv[i]) + "/" + entry->d_name);
    closedir(dir);
    std::sort(files.begin(), files.end());
    for (const std::string& file : files) {
      std::ifstream in(file, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::fprintf(stderr, "replay: %s\n", file.c_str());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++replayed;
    }
  }
  std::fprintf(stderr, "replay: %d inputs, no crash\n", replayed);
  return replayed > 0 ? 0 : 1;
}
