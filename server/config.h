// The daemon's config file (proto/replayd/v1/config.proto): a DaemonConfig in protobuf
// text format whose fields are named as the daemon's flags. Fields reach the flags by name
// through Abseil's flag reflection, so the flags stay the one place the daemon reads its
// settings from, and a new flag needs only its field.
#ifndef REPLAYD_SERVER_CONFIG_H_
#define REPLAYD_SERVER_CONFIG_H_

#include <filesystem>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "replayd/v1/config.pb.h"

namespace replayd {

// A config file as read: its fields and where in the file each is set.
class ConfigFile {
 public:
  // Reads and parses `path`. Fails with INVALID_ARGUMENT saying "FILE:LINE:COLUMN: field
  // NAME: why" on a syntax error, an unknown field, a value of the wrong type or a field
  // given twice, and when the file cannot be read.
  static absl::StatusOr<ConfigFile> Read(const std::filesystem::path& path);

  // Sets the flag named after each field the file sets, in the process's flag registry.
  // Fails with INVALID_ARGUMENT naming the file, line, column and field when a flag refuses
  // the value (a duration that does not parse), or when the field names no flag; flags set
  // before the failure keep their new values (the daemon then does not start).
  absl::Status SetFlags();

  // When SetFlags set the flag of field `name` and the flag still holds that value (the
  // command line did not give another): " (FILE:LINE:COLUMN sets NAME)"; otherwise "". For messages
  // about a flag's value, so that they point at the line that gave it.
  std::string Origin(absl::string_view name) const;

 private:
  struct Setting {
    std::string text;  // the value as its flag reads it
    int line = 0;      // 1-based
    int column = 0;    // 1-based
    std::optional<std::string> held;  // the flag's value once SetFlags set it, as the flag writes it
  };
  explicit ConfigFile(std::filesystem::path path) : path_(std::move(path)) {}

  std::filesystem::path path_;
  absl::flat_hash_map<std::string, Setting> settings_;  // by field name
};

// The config the flags hold now: every field of DaemonConfig, from its flag's current
// value. Fails with INTERNAL when a field names no flag or a value does not fit the field.
absl::StatusOr<v1::DaemonConfig> ConfigFromFlags();

// Checks that DaemonConfig and the flags declared in the source file whose path ends in
// `flags_file` (server/main.cc) agree: each field names such a flag of a type it can hold,
// and each such flag, except those in `not_in_config` (--config itself), has a field.
// Fails with INTERNAL naming the first that does not.
absl::Status CheckConfigMatchesFlags(absl::string_view flags_file, absl::Span<const absl::string_view> not_in_config);

// The value of --config on a command line (`--config=FILE`, `--config FILE`, with one or
// two dashes), read before the command line is parsed so that the file's settings are in
// place first and the flags given on the command line win; nullopt without it.
std::optional<std::string> ConfigFlagIn(int argc, char** argv);

}  // namespace replayd

#endif  // REPLAYD_SERVER_CONFIG_H_
