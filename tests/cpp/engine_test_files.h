// Helpers shared by the engine file-format tests: scratch folders and little-endian bytes.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace beaconkv::test_files {

// A folder of this process under ::testing::TempDir(), so that concurrent runs do not collide;
// removed at exit.
inline std::string TempRoot() {
  struct Folder {
    Folder() {
      path = ::testing::TempDir();
      while (path.size() > 1 && path.back() == '/') path.pop_back();
      path = absl::StrCat(path, "/bkv_engine_", getpid());
      std::filesystem::create_directories(path);
    }
    ~Folder() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
    std::string path;
  };
  static Folder folder;
  return folder.path;
}

// `v` as 8 little-endian bytes (the safetensors header length).
inline std::string Le64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

}  // namespace beaconkv::test_files
