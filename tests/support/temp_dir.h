// A fresh directory under the system temp dir, removed with everything in it when the
// object goes.
#ifndef REPLAYD_TESTS_SUPPORT_TEMP_DIR_H_
#define REPLAYD_TESTS_SUPPORT_TEMP_DIR_H_

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace replayd {

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "replayd-test-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace replayd

#endif  // REPLAYD_TESTS_SUPPORT_TEMP_DIR_H_
