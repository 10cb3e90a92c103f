#include "drivers/cpu/trampoline.h"

#include <gtest/gtest.h>

namespace replayd {
namespace {

TEST(TrampolineTest, UnpacksEachParamInSignatureOrder) {
  Signature sig;
  sig.params = {{"out", ParamKind::kBuffer, Access::kOut},
                {"n", ParamKind::kInt32, Access::kNone},
                {"m", ParamKind::kInt64, Access::kNone}};
  std::string t = GenerateTrampoline("add", sig);
  EXPECT_NE(t.find("void replayd_entry(const long long *args, int core_id)"), std::string::npos) << t;
  EXPECT_NE(t.find("add((void *)(__UINTPTR_TYPE__)args[0], (int)args[1], (long long)args[2]);"),
            std::string::npos)
      << t;
}

TEST(TrampolineTest, AppendsCoreIdWhenAsked) {
  Signature sig;
  sig.params = {{"x", ParamKind::kBuffer, Access::kInout}};
  sig.core_id = true;
  EXPECT_NE(GenerateTrampoline("k", sig).find("k((void *)(__UINTPTR_TYPE__)args[0], core_id);"),
            std::string::npos);
}

TEST(TrampolineTest, HandlesEmptySignatures) {
  Signature none;
  EXPECT_NE(GenerateTrampoline("k", none).find("k();"), std::string::npos);
  Signature only_core;
  only_core.core_id = true;
  EXPECT_NE(GenerateTrampoline("k", only_core).find("k(core_id);"), std::string::npos);
}

TEST(TrampolineTest, ExportsTheEntryFromAHiddenVisibilityBuild) {
  EXPECT_NE(GenerateTrampoline("k", {}).find("visibility(\"default\")"), std::string::npos);
}

}  // namespace
}  // namespace replayd
