#include "server/translate.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace replayd {
namespace {

absl::StatusOr<Param> FromProto(const v1::Param& p, int index) {
  Param out;
  out.name = p.name();
  switch (p.kind()) {
    case v1::Param::BUFFER:
      out.kind = ParamKind::kBuffer;
      break;
    case v1::Param::INT32:
      out.kind = ParamKind::kInt32;
      break;
    case v1::Param::INT64:
      out.kind = ParamKind::kInt64;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("signature param ", index, ": kind ", p.kind(), " is not BUFFER, INT32 or INT64"));
  }
  switch (p.access()) {
    case v1::Param::ACCESS_UNSPECIFIED:
      out.access = Access::kNone;
      break;
    case v1::Param::IN:
      out.access = Access::kIn;
      break;
    case v1::Param::OUT:
      out.access = Access::kOut;
      break;
    case v1::Param::INOUT:
      out.access = Access::kInout;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("signature param ", index, ": access ", p.access(), " is not IN, OUT or INOUT"));
  }
  return out;
}

absl::StatusOr<Expression> ExprFromProto(const v1::Expr& e, std::span<const VariableDecl> variables, int depth,
                                         size_t* nodes) {
  if (depth > 64) return absl::InvalidArgumentError("expression nested more than 64 deep");
  if (++*nodes > Expression::kMaxNodes)
    return absl::InvalidArgumentError(absl::StrCat("expression has more than ", Expression::kMaxNodes, " nodes"));
  switch (e.node_case()) {
    case v1::Expr::kConstant:
      return Expression::Constant(e.constant());
    case v1::Expr::kText:
      return Expression::Parse(e.text(), variables);
    case v1::Expr::kVariable:
      for (size_t i = 0; i < variables.size(); ++i)
        if (variables[i].name == e.variable()) return Expression::Var(static_cast<int>(i));
      return absl::InvalidArgumentError(
          absl::StrCat("expression names unknown variable \"", e.variable().substr(0, 64), "\""));
    case v1::Expr::kBinary: {
      using Op = Expression::Op;
      Op op;
      switch (e.binary().op()) {
        case v1::BinaryExpr::ADD:
          op = Op::kAdd;
          break;
        case v1::BinaryExpr::SUB:
          op = Op::kSub;
          break;
        case v1::BinaryExpr::MUL:
          op = Op::kMul;
          break;
        case v1::BinaryExpr::FLOORDIV:
          op = Op::kFloorDiv;
          break;
        case v1::BinaryExpr::MOD:
          op = Op::kMod;
          break;
        case v1::BinaryExpr::MIN:
          op = Op::kMin;
          break;
        case v1::BinaryExpr::MAX:
          op = Op::kMax;
          break;
        default:
          return absl::InvalidArgumentError(absl::StrCat("expression op ", e.binary().op(), " is unknown"));
      }
      absl::StatusOr<Expression> lhs = ExprFromProto(e.binary().lhs(), variables, depth + 1, nodes);
      if (!lhs.ok()) return lhs;
      absl::StatusOr<Expression> rhs = ExprFromProto(e.binary().rhs(), variables, depth + 1, nodes);
      if (!rhs.ok()) return rhs;
      Expression out = Expression::Binary(op, *lhs, *rhs);
      if (out.nodes().size() > Expression::kMaxNodes)
        return absl::InvalidArgumentError(
            absl::StrCat("expression has ", out.nodes().size(), " nodes, more than ", Expression::kMaxNodes));
      return out;
    }
    default:
      return absl::InvalidArgumentError("expression has no value");
  }
}

absl::StatusOr<std::vector<Expression>> DimsFromProto(const google::protobuf::RepeatedField<uint64_t>& plain,
                                                      const google::protobuf::RepeatedPtrField<v1::Expr>& symbolic,
                                                      std::span<const VariableDecl> variables, absl::string_view what) {
  if (!plain.empty() && !symbolic.empty())
    return absl::InvalidArgumentError(absl::StrCat(what, " and ", what, "_expr are both set"));
  if (plain.size() > 3 || symbolic.size() > 3)
    return absl::InvalidArgumentError(absl::StrCat(what, " has more than 3 dimensions"));
  std::vector<Expression> dims;
  for (uint64_t d : plain) {
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return absl::InvalidArgumentError(absl::StrCat(what, " dimension ", d, " is too large"));
    dims.push_back(Expression::Constant(static_cast<int64_t>(d)));
  }
  for (const v1::Expr& e : symbolic) {
    size_t nodes = 0;
    absl::StatusOr<Expression> x = ExprFromProto(e, variables, 0, &nodes);
    if (!x.ok()) return x.status();
    dims.push_back(std::move(*x));
  }
  return dims;
}

}  // namespace

absl::StatusOr<VariableDecl> FromProto(const v1::Variable& v) {
  VariableDecl out{v.name(), v.min(), v.max(), v.multiple_of() == 0 ? 1 : v.multiple_of()};
  if (absl::Status s = CheckVariable(out); !s.ok()) return s;
  return out;
}

absl::StatusOr<Expression> FromProto(const v1::Expr& expr, std::span<const VariableDecl> variables) {
  size_t nodes = 0;
  return ExprFromProto(expr, variables, 0, &nodes);
}

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
  if (request.variables_size() > static_cast<int>(kMaxGraphVariables))
    return absl::InvalidArgumentError(absl::StrCat("more than ", kMaxGraphVariables, " variables"));
  std::vector<VariableDecl> variables;
  for (const v1::BoundVariable& b : request.variables()) {
    absl::StatusOr<VariableDecl> v = FromProto(b.variable());
    if (!v.ok()) return v.status();
    variables.push_back(*v);
    op.variables.push_back({*v, b.value()});
  }
  absl::StatusOr<std::vector<Expression>> global =
      DimsFromProto(request.global(), request.global_expr(), variables, "global");
  if (!global.ok()) return global.status();
  op.global = std::move(*global);
  absl::StatusOr<std::vector<Expression>> local =
      DimsFromProto(request.local(), request.local_expr(), variables, "local");
  if (!local.ok()) return local.status();
  op.local = std::move(*local);
  if (request.args_size() > 1024) return absl::InvalidArgumentError("more than 1024 arguments");
  op.args.reserve(request.args_size());
  for (int i = 0; i < request.args_size(); ++i) {
    const v1::Arg& arg = request.args(i);
    switch (arg.value_case()) {
      case v1::Arg::kView:
        op.args.emplace_back(ViewArg{arg.view().buffer(), arg.view().offset(), arg.view().length()});
        break;
      case v1::Arg::kIntValue:
        op.args.emplace_back(Expression::Constant(arg.int_value()));
        break;
      case v1::Arg::kExpr: {
        absl::StatusOr<Expression> e = FromProto(arg.expr(), variables);
        if (!e.ok()) return absl::InvalidArgumentError(absl::StrCat("argument ", i, ": ", e.status().message()));
        op.args.emplace_back(std::move(*e));
        break;
      }
      default:
        return absl::InvalidArgumentError(absl::StrCat("argument ", i, " has no value"));
    }
  }
  return op;
}

absl::StatusOr<CopyOp> FromProto(const v1::CopyBufferRequest& request) {
  if (!request.has_dst() || !request.has_src()) return absl::InvalidArgumentError("a copy needs dst and src views");
  auto view = [](const v1::View& v) { return ViewArg{v.buffer(), v.offset(), v.length()}; };
  return CopyOp{view(request.dst()), view(request.src()), request.wait()};
}

absl::StatusOr<GraphDef> FromProto(const v1::GraphDef& def) {
  GraphDef out;
  if (absl::Status s = CheckGraphLimits(def.variables_size(), def.slots_size(), def.calls_size()); !s.ok()) return s;
  for (const v1::Variable& v : def.variables()) {
    absl::StatusOr<VariableDecl> var = FromProto(v);
    if (!var.ok()) return var.status();
    out.variables.push_back(*var);
  }
  for (int i = 0; i < def.slots_size(); ++i) {
    const v1::Slot& s = def.slots(i);
    SlotDef slot{SlotKind::kParameter, s.bytes(), s.buffer()};
    switch (s.kind()) {
      case v1::Slot::PARAMETER:
        slot.kind = SlotKind::kParameter;
        break;
      case v1::Slot::INTERNAL:
        slot.kind = SlotKind::kInternal;
        break;
      case v1::Slot::CONSTANT:
        slot.kind = SlotKind::kConstant;
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat("slot ", i, ": kind ", s.kind(), " is unknown"));
    }
    out.slots.push_back(slot);
  }
  for (int c = 0; c < def.calls_size(); ++c) {
    const v1::GraphCall& call = def.calls(c);
    CallDef cd;
    cd.program = call.program();
    if (call.has_copy()) {
      if (call.program() != 0 || call.args_size() != 0 || call.global_size() != 0 || call.local_size() != 0)
        return absl::InvalidArgumentError(absl::StrCat("call ", c, ": a copy has no program, args or dimensions"));
      if (!call.copy().has_dst() || !call.copy().has_src())
        return absl::InvalidArgumentError(absl::StrCat("call ", c, ": a copy needs dst and src views"));
      auto view = [](const v1::SlotView& v) { return SlotView{v.slot(), v.offset(), v.length()}; };
      cd.copy = true;
      cd.args = {view(call.copy().dst()), view(call.copy().src())};
      out.calls.push_back(std::move(cd));
      continue;
    }
    if (call.args_size() > 1024) return absl::InvalidArgumentError(absl::StrCat("call ", c, ": too many arguments"));
    for (int i = 0; i < call.args_size(); ++i) {
      const v1::GraphArg& a = call.args(i);
      if (a.has_view()) {
        cd.args.emplace_back(SlotView{a.view().slot(), a.view().offset(), a.view().length()});
      } else if (a.has_expr()) {
        absl::StatusOr<Expression> e = FromProto(a.expr(), out.variables);
        if (!e.ok())
          return absl::InvalidArgumentError(absl::StrCat("call ", c, " argument ", i, ": ", e.status().message()));
        cd.args.emplace_back(std::move(*e));
      } else {
        return absl::InvalidArgumentError(absl::StrCat("call ", c, " argument ", i, " has no value"));
      }
    }
    google::protobuf::RepeatedField<uint64_t> none;
    absl::StatusOr<std::vector<Expression>> global = DimsFromProto(none, call.global(), out.variables, "global");
    if (!global.ok()) return absl::InvalidArgumentError(absl::StrCat("call ", c, ": ", global.status().message()));
    absl::StatusOr<std::vector<Expression>> local = DimsFromProto(none, call.local(), out.variables, "local");
    if (!local.ok()) return absl::InvalidArgumentError(absl::StrCat("call ", c, ": ", local.status().message()));
    cd.global = std::move(*global);
    cd.local = std::move(*local);
    out.calls.push_back(std::move(cd));
  }
  return out;
}

namespace {

absl::Status ParamsFromProto(const google::protobuf::RepeatedPtrField<v1::ParamValue>& params,
                             std::vector<ParamValue>& out) {
  if (params.size() > static_cast<int>(kMaxGraphSlots + kMaxGraphVariables))
    return absl::InvalidArgumentError("too many parameters");
  out.clear();
  for (int i = 0; i < params.size(); ++i) {
    const v1::ParamValue& p = params[i];
    switch (p.value_case()) {
      case v1::ParamValue::kBuffer:
        out.emplace_back(BufferParam{p.buffer()});
        break;
      case v1::ParamValue::kIntValue:
        out.emplace_back(p.int_value());
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat("parameter ", i, " has no value"));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadsFromProto(const google::protobuf::RepeatedPtrField<v1::View>& reads, std::vector<ViewArg>& out) {
  if (reads.size() > 1024) return absl::InvalidArgumentError("more than 1024 reads");
  out.clear();
  for (const v1::View& v : reads) out.push_back({v.buffer(), v.offset(), v.length()});
  return absl::OkStatus();
}

}  // namespace

absl::Status FromProto(const v1::ReplayGraphRequest& request, ReplayOp& op) {
  op.graph = request.graph();
  op.wait = request.wait();
  if (absl::Status s = ParamsFromProto(request.params(), op.params); !s.ok()) return s;
  return ReadsFromProto(request.reads(), op.reads);
}

absl::StatusOr<ReplayOp> FromProto(const v1::ReplayGraphRequest& request) {
  ReplayOp op;
  if (absl::Status s = FromProto(request, op); !s.ok()) return s;
  return op;
}

absl::StatusOr<ReplaySequenceOp> FromProto(const v1::ReplaySequenceRequest& request) {
  ReplaySequenceOp op;
  op.graph = request.graph();
  if (request.vectors_size() > static_cast<int>(kMaxSequenceReplays))
    return absl::InvalidArgumentError("too many parameter vectors");
  op.vectors.resize(request.vectors_size());
  for (int i = 0; i < request.vectors_size(); ++i)
    if (absl::Status s = ParamsFromProto(request.vectors(i).params(), op.vectors[i]); !s.ok())
      return absl::Status(s.code(), absl::StrCat("vector ", i, ": ", s.message()));
  if (absl::Status s = ParamsFromProto(request.base(), op.base); !s.ok()) return s;
  op.step_param = request.step_param();
  op.step = request.step();
  op.count = request.count();
  op.stream_reads = request.stream_reads();
  if (absl::Status s = ReadsFromProto(request.reads(), op.reads); !s.ok()) return s;
  return op;
}

void ToProto(const GraphInfo& info, v1::GraphReply* out) {
  out->set_graph(info.handle);
  out->set_key(info.key);
  out->set_cache_hit(info.cache_hit);
  out->set_calls(static_cast<uint32_t>(info.calls));
  out->set_batches(static_cast<uint32_t>(info.batches));
  out->set_arena_bytes(info.arena_bytes);
  out->set_plan_saved_bytes(info.saved_bytes);
  out->set_replays(info.replays);
  for (size_t i = 0; i < info.params.size(); ++i) {
    const GraphParamInfo& p = info.params[i];
    v1::GraphParam* gp = out->add_params();
    gp->set_index(static_cast<uint32_t>(i));
    if (p.is_buffer) {
      gp->set_buffer_bytes(p.bytes);
      gp->set_slot(p.slot);
    } else {
      v1::Variable* v = gp->mutable_variable();
      v->set_name(p.variable.name);
      v->set_min(p.variable.min);
      v->set_max(p.variable.max);
      v->set_multiple_of(p.variable.multiple_of);
    }
  }
  v1::GraphCacheStats* c = out->mutable_cache();
  c->set_hits(info.cache.hits);
  c->set_misses(info.cache.misses);
  c->set_instantiations(info.cache.instantiations);
  c->set_evictions(info.cache.evictions);
  c->set_graphs(info.cache.graphs);
  c->set_bytes(info.cache.bytes);
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
  out->set_architecture(info.architecture);
}

}  // namespace replayd
