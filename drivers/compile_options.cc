#include "drivers/compile_options.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "drivers/client_text.h"

namespace replayd {

bool IsIdentifier(absl::string_view s) {
  if (s.empty() || absl::ascii_isdigit(s[0])) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return absl::ascii_isalnum(c) || c == '_'; });
}

absl::Status CheckCompileOptions(const std::vector<std::string>& options, const std::vector<std::string>& flags,
                                 absl::string_view format) {
  for (const std::string& o : options) {
    bool ok = std::find(flags.begin(), flags.end(), o) != flags.end();
    if (!ok && absl::StartsWith(o, "-D")) {
      absl::string_view def = absl::string_view(o).substr(2);
      size_t eq = def.find('=');
      ok = IsIdentifier(def.substr(0, eq));
      if (ok && eq != absl::string_view::npos)
        for (char c : def.substr(eq + 1)) ok = ok && (absl::ascii_isalnum(c) || c == '_' || c == '.' || c == '-');
    }
    if (!ok) return absl::InvalidArgumentError(absl::StrCat("option \"", Echo(o), "\" is not allowed for ", format));
  }
  return absl::OkStatus();
}

}  // namespace replayd
