// Conversions between the driver interface's values and the executor protocol's messages.
#ifndef REPLAYD_DRIVERS_EXECUTOR_WIRE_H_
#define REPLAYD_DRIVERS_EXECUTOR_WIRE_H_

#include <optional>
#include <span>
#include <vector>

#include "drivers/driver.h"
#include "drivers/executor/executor.pb.h"
#include "google/protobuf/repeated_field.h"

namespace replayd::executor {

inline void ToWire(const replayd::Dim3& d, executor::Dims& out) {
  out.set_x(d[0]);
  out.set_y(d[1]);
  out.set_z(d[2]);
}

inline replayd::Dim3 FromWire(const executor::Dims& d) { return {d.x(), d.y(), d.z()}; }

inline void ArgsToWire(std::span<const ArgValue> args, google::protobuf::RepeatedField<uint64_t>& out) {
  out.Reserve(static_cast<int>(args.size()));
  for (const ArgValue& a : args) out.Add(a.address);
}

inline std::vector<ArgValue> ArgsFromWire(const google::protobuf::RepeatedField<uint64_t>& args) {
  std::vector<ArgValue> out(args.size());
  for (int i = 0; i < args.size(); ++i) out[i].address = args[i];
  return out;
}

inline void ToWire(const ProgramSource& source, const std::string& artifact, executor::Load& out) {
  out.set_format(source.format);
  out.set_entry(source.entry);
  for (const replayd::Param& p : source.signature.params) {
    executor::Param* q = out.add_params();
    q->set_kind(static_cast<uint32_t>(p.kind));
    q->set_access(static_cast<uint32_t>(p.access));
  }
  out.set_core_id(source.signature.core_id);
  out.set_artifact(artifact);
}

// The source as far as loading needs it: format, entry and signature (not the code).
inline ProgramSource FromWire(const executor::Load& load) {
  ProgramSource source;
  source.format = load.format();
  source.entry = load.entry();
  for (const executor::Param& p : load.params()) {
    replayd::Param q;
    q.kind = p.kind() <= 2 ? static_cast<ParamKind>(p.kind()) : ParamKind::kInt64;
    q.access = p.access() <= 3 ? static_cast<Access>(p.access()) : Access::kNone;
    source.signature.params.push_back(q);
  }
  source.signature.core_id = load.core_id();
  return source;
}

inline void SetTime(const std::optional<absl::Duration>& t, Reply& reply) {
  if (!t) return;
  reply.set_has_time(true);
  reply.set_device_time_ns(absl::ToInt64Nanoseconds(*t));
}

}  // namespace replayd::executor

#endif  // REPLAYD_DRIVERS_EXECUTOR_WIRE_H_
