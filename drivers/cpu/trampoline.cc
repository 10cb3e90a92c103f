#include "drivers/cpu/trampoline.h"

#include "absl/strings/str_cat.h"

namespace replayd {
namespace {

std::string Unpack(const Param& param, size_t index) {
  switch (param.kind) {
    case ParamKind::kBuffer:
      return absl::StrCat("(void *)(__UINTPTR_TYPE__)args[", index, "]");
    case ParamKind::kInt32:
      return absl::StrCat("(int)args[", index, "]");
    case ParamKind::kInt64:
      return absl::StrCat("(long long)args[", index, "]");
  }
  return "0";
}

}  // namespace

std::string GenerateTrampoline(absl::string_view entry, const Signature& signature) {
  std::string call;
  for (size_t i = 0; i < signature.params.size(); ++i) {
    absl::StrAppend(&call, i ? ", " : "", Unpack(signature.params[i], i));
  }
  if (signature.core_id) absl::StrAppend(&call, call.empty() ? "" : ", ", "core_id");
  return absl::StrCat(
      "\n/* replayd entry trampoline */\n",
      "__attribute__((visibility(\"default\"))) void ", kTrampolineSymbol,
      "(const long long *args, int core_id) {\n",
      "  (void)args; (void)core_id;\n",
      "  ", entry, "(", call, ");\n",
      "}\n");
}

}  // namespace replayd
