#include "server/translate.h"

#include "absl/strings/str_cat.h"

namespace replayd {
namespace {

absl::StatusOr<Param> FromProto(const v1::Param& p, int index) {
  Param out;
  out.name = p.name();
  switch (p.kind()) {
    case v1::Param::BUFFER: out.kind = ParamKind::kBuffer; break;
    case v1::Param::INT32: out.kind = ParamKind::kInt32; break;
    case v1::Param::INT64: out.kind = ParamKind::kInt64; break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("signature param ", index, ": kind ", p.kind(), " is not BUFFER, INT32 or INT64"));
  }
  switch (p.access()) {
    case v1::Param::ACCESS_UNSPECIFIED: out.access = Access::kNone; break;
    case v1::Param::IN: out.access = Access::kIn; break;
    case v1::Param::OUT: out.access = Access::kOut; break;
    case v1::Param::INOUT: out.access = Access::kInout; break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("signature param ", index, ": access ", p.access(), " is not IN, OUT or INOUT"));
  }
  return out;
}

}  // namespace

absl::StatusOr<ProgramSource> FromProto(const v1::LoadProgramRequest& request) {
  ProgramSource source;
  source.format = request.format();
  source.code = request.code();
  source.entry = request.entry();
  source.options.assign(request.options().begin(), request.options().end());
  source.signature.core_id = request.signature().core_id();
  // Bounded before the copy so that a huge list cannot cost memory here.
  if (request.signature().params_size() > 1024)
    return absl::InvalidArgumentError("signature has more than 1024 params");
  for (int i = 0; i < request.signature().params_size(); ++i) {
    absl::StatusOr<Param> p = FromProto(request.signature().params(i), i);
    if (!p.ok()) return p.status();
    source.signature.params.push_back(std::move(*p));
  }
  return source;
}

absl::StatusOr<LaunchOp> FromProto(const v1::LaunchRequest& request) {
  LaunchOp op;
  op.program = request.program();
  op.wait = request.wait();
  op.global.assign(request.global().begin(), request.global().end());
  op.local.assign(request.local().begin(), request.local().end());
  op.args.reserve(request.args_size());
  for (int i = 0; i < request.args_size(); ++i) {
    const v1::Arg& arg = request.args(i);
    switch (arg.value_case()) {
      case v1::Arg::kView:
        op.args.emplace_back(ViewArg{arg.view().buffer(), arg.view().offset(), arg.view().length()});
        break;
      case v1::Arg::kIntValue:
        op.args.emplace_back(arg.int_value());
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat("argument ", i, " has no value"));
    }
  }
  return op;
}

void ToProto(const DeviceStatus& device, v1::Device* out) {
  const DeviceInfo& info = *device.info;
  out->set_id(info.id);
  out->set_kind(std::string(DeviceKindName(info.kind)));
  out->set_name(info.name);
  out->set_total_memory(info.total_memory);
  out->set_free_memory(device.free_memory);
  v1::LaunchLimits* limits = out->mutable_limits();
  for (uint64_t g : info.limits.max_global) limits->add_max_global(g);
  limits->set_max_global_total(info.limits.max_global_total);
  for (uint64_t l : info.limits.max_local) limits->add_max_local(l);
  limits->set_max_local_total(info.limits.max_local_total);
  limits->set_max_args(info.limits.max_args);
  for (const auto& f : info.formats) out->add_formats(f);
  out->set_driver_version(info.driver_version);
}

}  // namespace replayd
