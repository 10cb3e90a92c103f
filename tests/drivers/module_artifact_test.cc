#include "drivers/module_artifact.h"

#include <gmock/gmock.h>

#include <fstream>

#include "tests/support/temp_dir.h"

namespace replayd {
namespace {

TEST(ModuleArtifactTest, WhatIsWrittenReadsBackByteForByte) {
  TempDir dir;
  ModuleArtifact a{"_Z5scalePfi", std::string("\x7f"
                                              "ELF\0\n\nbinary\n",
                                              14)};
  ASSERT_TRUE(WriteModuleArtifact(a, dir.path() / "m").ok());
  auto back = ReadModuleArtifact(dir.path() / "m");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->entry, a.entry);
  EXPECT_EQ(back->image, a.image);
}

TEST(ModuleArtifactTest, AForeignOrMissingFileIsDataLoss) {
  TempDir dir;
  std::ofstream(dir.path() / "foreign") << "\x7f"
                                           "ELF not ours";
  std::ofstream(dir.path() / "no-entry") << "replayd-module 1\n";
  for (const char* name : {"foreign", "no-entry", "missing"})
    EXPECT_EQ(ReadModuleArtifact(dir.path() / name).status().code(), absl::StatusCode::kDataLoss) << name;
}

}  // namespace
}  // namespace replayd
