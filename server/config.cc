#include "server/config.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <optional>
#include <tuple>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/text_format.h"

namespace replayd {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Reflection;

// Keeps the first error the text format parser reports (0-based line and column).
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    if (!message_.empty()) return;
    line_ = line;
    column_ = column;
    message_ = message;
  }
  int line() const { return line_; }
  int column() const { return column_; }
  const std::string& message() const { return message_; }

 private:
  int line_ = 0;
  int column_ = 0;
  std::string message_;
};

class IgnoreErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int, google::protobuf::io::ColumnNumber, const std::string&) override {}
};

// The field whose name or value holds position (line, column) of `text` (0-based): the
// last field name that starts at or before it, a field name being an identifier that does
// not stand where a value does (after ':', '[' or ','). The parser's messages say what is
// wrong with a value but not always whose value it is.
std::string FieldAt(const std::string& text, int line, int column) {
  google::protobuf::io::ArrayInputStream input(text.data(), static_cast<int>(text.size()));
  IgnoreErrors ignore;
  google::protobuf::io::Tokenizer tokenizer(&input, &ignore);
  tokenizer.set_comment_style(google::protobuf::io::Tokenizer::SH_COMMENT_STYLE);
  std::string field, previous;
  while (tokenizer.Next()) {
    const google::protobuf::io::Tokenizer::Token& token = tokenizer.current();
    if (std::tie(token.line, token.column) > std::tie(line, column)) break;
    if (token.type == google::protobuf::io::Tokenizer::TYPE_IDENTIFIER && previous != ":" && previous != "[" &&
        previous != ",")
      field = token.text;
    previous = token.text;
  }
  return field;
}

// The field's value in `message` as its flag's text: strings as they are, integers in
// decimal, bools as true or false.
absl::StatusOr<std::string> FlagText(const google::protobuf::Message& message, const FieldDescriptor& field) {
  const Reflection& r = *message.GetReflection();
  switch (field.cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      return r.GetString(message, &field);
    case FieldDescriptor::CPPTYPE_BOOL:
      return std::string(r.GetBool(message, &field) ? "true" : "false");
    case FieldDescriptor::CPPTYPE_INT32:
      return absl::StrCat(r.GetInt32(message, &field));
    case FieldDescriptor::CPPTYPE_INT64:
      return absl::StrCat(r.GetInt64(message, &field));
    case FieldDescriptor::CPPTYPE_UINT32:
      return absl::StrCat(r.GetUInt32(message, &field));
    case FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrCat(r.GetUInt64(message, &field));
    default:
      return absl::InternalError(absl::StrCat("config field ", field.name(), ": type ", field.type_name(),
                                              " has no flag type"));
  }
}

// Sets `field` of `message` from a flag's text; false when the text does not fit it.
bool SetFromFlagText(const std::string& text, const FieldDescriptor& field, google::protobuf::Message& message) {
  const Reflection& r = *message.GetReflection();
  switch (field.cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      r.SetString(&message, &field, text);
      return true;
    case FieldDescriptor::CPPTYPE_BOOL: {
      bool v = false;
      if (!absl::SimpleAtob(text, &v)) return false;
      r.SetBool(&message, &field, v);
      return true;
    }
    case FieldDescriptor::CPPTYPE_INT32: {
      int32_t v = 0;
      if (!absl::SimpleAtoi(text, &v)) return false;
      r.SetInt32(&message, &field, v);
      return true;
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      int64_t v = 0;
      if (!absl::SimpleAtoi(text, &v)) return false;
      r.SetInt64(&message, &field, v);
      return true;
    }
    case FieldDescriptor::CPPTYPE_UINT32: {
      uint32_t v = 0;
      if (!absl::SimpleAtoi(text, &v)) return false;
      r.SetUInt32(&message, &field, v);
      return true;
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      uint64_t v = 0;
      if (!absl::SimpleAtoi(text, &v)) return false;
      r.SetUInt64(&message, &field, v);
      return true;
    }
    default:
      return false;
  }
}

// Whether a flag of this type holds what the field holds.
bool FieldHoldsFlag(const FieldDescriptor& field, const absl::CommandLineFlag& flag) {
  switch (field.cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      return flag.IsOfType<std::string>() || flag.IsOfType<absl::Duration>();
    case FieldDescriptor::CPPTYPE_BOOL:
      return flag.IsOfType<bool>();
    case FieldDescriptor::CPPTYPE_INT32:
      // An optional<int> flag unset is a field left out.
      return flag.IsOfType<int>() || flag.IsOfType<int32_t>() || flag.IsOfType<std::optional<int>>();
    case FieldDescriptor::CPPTYPE_INT64:
      return flag.IsOfType<int64_t>();
    case FieldDescriptor::CPPTYPE_UINT32:
      return flag.IsOfType<uint32_t>();
    case FieldDescriptor::CPPTYPE_UINT64:
      return flag.IsOfType<uint64_t>();
    default:
      return false;
  }
}

}  // namespace

absl::StatusOr<ConfigFile> ConfigFile::Read(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    return absl::InvalidArgumentError(absl::StrCat("cannot read config file ", path.string(), ": ",
                                                   ec ? ec.message() : "not a regular file"));
  std::ifstream in(path);
  std::stringstream buffer;
  if (in) buffer << in.rdbuf();
  if (!in || in.bad())
    return absl::InvalidArgumentError(absl::StrCat("cannot read config file ", path.string(), ": ", strerror(errno)));
  const std::string text = buffer.str();

  v1::DaemonConfig config;
  google::protobuf::TextFormat::Parser parser;
  google::protobuf::TextFormat::ParseInfoTree locations;
  FirstError error;
  parser.RecordErrorsTo(&error);
  parser.WriteLocationsTo(&locations);
  if (!parser.ParseFromString(text, &config)) {
    const std::string field = FieldAt(text, error.line(), error.column());
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ":", error.line() + 1, ":", error.column() + 1,
                                                   ": ", field.empty() ? "" : absl::StrCat("field ", field, ": "),
                                                   error.message()));
  }
  ConfigFile file(path);
  std::vector<const FieldDescriptor*> fields;
  config.GetReflection()->ListFields(config, &fields);
  for (const FieldDescriptor* field : fields) {
    absl::StatusOr<std::string> text_value = FlagText(config, *field);
    if (!text_value.ok()) return text_value.status();
    const auto where = locations.GetLocation(field, -1);
    file.settings_[field->name()] = {*std::move(text_value), where.line + 1, where.column + 1, std::nullopt};
  }
  return file;
}

absl::Status ConfigFile::SetFlags() {
  // In the file's order, so that the first bad line is the one named.
  std::vector<std::pair<const std::string, Setting>*> in_order;
  for (auto& entry : settings_) in_order.push_back(&entry);
  std::sort(in_order.begin(), in_order.end(), [](const auto* a, const auto* b) {
    return std::tie(a->second.line, a->second.column) < std::tie(b->second.line, b->second.column);
  });
  for (auto* entry : in_order) {
    const std::string& name = entry->first;
    Setting& setting = entry->second;
    const std::string where = absl::StrCat(path_.string(), ":", setting.line, ":", setting.column, ": field ", name);
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) return absl::InvalidArgumentError(absl::StrCat(where, ": the daemon has no such flag"));
    std::string why;
    if (!flag->ParseFrom(setting.text, &why))
      return absl::InvalidArgumentError(absl::StrCat(where, ": \"", setting.text, "\": ", why));
    setting.held = flag->CurrentValue();
  }
  return absl::OkStatus();
}

std::string ConfigFile::Origin(absl::string_view name) const {
  const auto it = settings_.find(name);
  if (it == settings_.end()) return "";
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr || !it->second.held || flag->CurrentValue() != *it->second.held) return "";
  return absl::StrCat(" (", path_.string(), ":", it->second.line, ":", it->second.column, " sets ", name, ")");
}

absl::StatusOr<v1::DaemonConfig> ConfigFromFlags() {
  v1::DaemonConfig config;
  const google::protobuf::Descriptor& descriptor = *config.GetDescriptor();
  for (int i = 0; i < descriptor.field_count(); ++i) {
    const FieldDescriptor& field = *descriptor.field(i);
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(field.name());
    if (flag == nullptr) return absl::InternalError(absl::StrCat("config field ", field.name(), " names no flag"));
    const std::string value = flag->CurrentValue();
    // An optional flag that is not set (an empty text) leaves its field out.
    if (value.empty() && field.cpp_type() != FieldDescriptor::CPPTYPE_STRING) continue;
    if (!SetFromFlagText(value, field, config))
      return absl::InternalError(
          absl::StrCat("--", field.name(), "=", value, " does not fit config field ", field.name(), " (", field.type_name(), ")"));
  }
  return config;
}

absl::Status CheckConfigMatchesFlags(absl::string_view flags_file, absl::Span<const absl::string_view> not_in_config) {
  // Abseil gives a flag's file name without its leading slashes ("/src/main.cc" ->
  // "src/main.cc"), so `flags_file` (a __FILE__, absolute or not) is compared without them.
  while (absl::ConsumePrefix(&flags_file, "/")) {
  }
  const google::protobuf::Descriptor& descriptor = *v1::DaemonConfig::descriptor();
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!absl::EndsWith(flag->Filename(), flags_file) || flag->IsRetired()) continue;
    if (descriptor.FindFieldByName(std::string(name)) != nullptr) continue;
    if (std::find(not_in_config.begin(), not_in_config.end(), name) != not_in_config.end()) continue;
    return absl::InternalError(
        absl::StrCat("--", name, " has no field in DaemonConfig (proto/replayd/v1/config.proto): add one"));
  }
  for (int i = 0; i < descriptor.field_count(); ++i) {
    const FieldDescriptor& field = *descriptor.field(i);
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(field.name());
    if (flag == nullptr || !absl::EndsWith(flag->Filename(), flags_file))
      return absl::InternalError(absl::StrCat("config field ", field.name(), " names no flag of ", flags_file));
    if (!FieldHoldsFlag(field, *flag))
      return absl::InternalError(
          absl::StrCat("config field ", field.name(), " (", field.type_name(), ") cannot hold its flag's values"));
  }
  return absl::OkStatus();
}

std::optional<std::string> ConfigFlagIn(int argc, char** argv) {
  std::optional<std::string> value;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) continue;
    if (absl::ConsumePrefix(&arg, "config=")) {
      value = std::string(arg);
    } else if (arg == "config" && i + 1 < argc) {
      value = argv[++i];
    }
  }
  return value;
}

}  // namespace replayd
