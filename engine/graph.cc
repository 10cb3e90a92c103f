#include "engine/graph.h"

#include <openssl/evp.h>

#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "engine/buffer.h"
#include "engine/call.h"

namespace replayd {
namespace {

absl::Status CheckDimBounds(const std::array<Expression, 3>& dims, const Dim3& max, uint64_t max_total,
                            std::span<const VariableDecl> variables, absl::string_view what) {
  uint64_t total = 1;
  for (int d = 0; d < 3; ++d) {
    absl::StatusOr<Interval> b = dims[d].Bounds(variables);
    if (!b.ok()) return absl::InvalidArgumentError(absl::StrCat(what, "[", d, "]: ", b.status().message()));
    if (b->min < 1 || static_cast<uint64_t>(b->max) > max[d])
      return absl::InvalidArgumentError(absl::StrCat(what, "[", d, "] = ", dims[d].ToString(variables),
                                                     " ranges over [", b->min, ", ", b->max, "], outside [1, ", max[d],
                                                     "]"));
    if (total > max_total / static_cast<uint64_t>(b->max))
      return absl::InvalidArgumentError(
          absl::StrCat(what, " can reach more than the device limit of ", max_total, " in total"));
    total *= b->max;
  }
  return absl::OkStatus();
}

// The range argument `i` of `call` covers in its slot, after checking it is a view.
absl::StatusOr<std::pair<uint64_t, uint64_t>> CheckViewArg(const Graph& g, const GraphCall& call, size_t i) {
  const SlotView* v = std::get_if<SlotView>(&call.args[i]);
  if (!v) return absl::InvalidArgumentError(absl::StrCat("argument ", i, " must be a view"));
  if (v->slot >= g.slots.size())
    return absl::InvalidArgumentError(absl::StrCat("argument ", i, ": slot ", v->slot, " of ", g.slots.size()));
  absl::StatusOr<std::pair<uint64_t, uint64_t>> r =
      ResolveView({v->slot, v->offset, v->length}, g.slots[v->slot].bytes);
  if (!r.ok()) return absl::InvalidArgumentError(absl::StrCat("argument ", i, ": ", r.status().message()));
  return r;
}

absl::Status CheckCopyCall(const Graph& g, const GraphCall& call) {
  if (call.args.size() != 2)
    return absl::InvalidArgumentError(absl::StrCat("a copy takes 2 views, got ", call.args.size()));
  absl::StatusOr<std::pair<uint64_t, uint64_t>> dst = CheckViewArg(g, call, 0);
  if (!dst.ok()) return dst.status();
  absl::StatusOr<std::pair<uint64_t, uint64_t>> src = CheckViewArg(g, call, 1);
  if (!src.ok()) return src.status();
  const bool same_slot = std::get<SlotView>(call.args[0]).slot == std::get<SlotView>(call.args[1]).slot;
  if (absl::StatusOr<uint64_t> n = CheckCopyRanges(*dst, *src, same_slot); !n.ok()) return n.status();
  for (int d = 0; d < 3; ++d)
    if (call.global[d] != Expression::Constant(1) || call.local[d] != Expression::Constant(1))
      return absl::InvalidArgumentError("a copy has no launch dimensions");
  return absl::OkStatus();
}

absl::Status CheckCall(const Graph& g, size_t index, const DeviceInfo& device) {
  const GraphCall& call = g.calls[index];
  auto fail = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("call ", index, ": ", s.message()));
  };
  if (call.is_copy()) {
    if (absl::Status s = CheckCopyCall(g, call); !s.ok()) return fail(s);
    return absl::OkStatus();
  }
  const std::vector<Param>& params = call.program->kernel->signature().params;
  if (call.args.size() != params.size())
    return fail(absl::InvalidArgumentError(
        absl::StrCat(call.program->entry, " takes ", params.size(), " arguments, got ", call.args.size())));
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].kind == ParamKind::kBuffer) {
      if (absl::StatusOr<std::pair<uint64_t, uint64_t>> r = CheckViewArg(g, call, i); !r.ok()) return fail(r.status());
      continue;
    }
    const Expression* e = std::get_if<Expression>(&call.args[i]);
    if (!e) return fail(absl::InvalidArgumentError(absl::StrCat("argument ", i, " must be an integer")));
    absl::StatusOr<Interval> b = e->Bounds(g.variables);
    if (!b.ok()) return fail(absl::InvalidArgumentError(absl::StrCat("argument ", i, ": ", b.status().message())));
    if (params[i].kind == ParamKind::kInt32 &&
        (b->min < std::numeric_limits<int32_t>::min() || b->max > std::numeric_limits<int32_t>::max()))
      return fail(absl::InvalidArgumentError(
          absl::StrCat("argument ", i, " ranges over [", b->min, ", ", b->max, "], past int32")));
  }
  const LaunchLimits& l = device.limits;
  if (absl::Status s = CheckDimBounds(call.global, l.max_global, l.max_global_total, g.variables, "global"); !s.ok())
    return fail(s);
  if (absl::Status s = CheckDimBounds(call.local, l.max_local, l.max_local_total, g.variables, "local"); !s.ok())
    return fail(s);
  return absl::OkStatus();
}

void Append(std::string& out, int64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }

void Append(std::string& out, const Expression& e) {
  Append(out, static_cast<int64_t>(e.nodes().size()));
  for (const auto& n : e.nodes()) {
    out.push_back(static_cast<char>(n.op));
    Append(out, n.value);
  }
}

}  // namespace

Access GraphCall::access(size_t arg) const {
  if (is_copy()) return arg == 0 ? Access::kOut : Access::kIn;
  const std::vector<Param>& params = program->kernel->signature().params;
  return arg < params.size() ? params[arg].access : Access::kNone;
}

GraphCall CopyCall(const SlotView& dst, const SlotView& src) {
  GraphCall call;
  call.args = {dst, src};
  return call;
}

absl::Status CheckGraphLimits(size_t variables, size_t slots, size_t calls) {
  struct Limit {
    size_t count;
    size_t max;
    const char* what;
  };
  for (const Limit& l : {Limit{variables, kMaxGraphVariables, "variables"}, Limit{slots, kMaxGraphSlots, "slots"},
                         Limit{calls, kMaxGraphCalls, "calls"}})
    if (l.count > l.max)
      return absl::InvalidArgumentError(
          absl::StrCat("a graph has at most ", l.max, " ", l.what, "; this one would have ", l.count));
  return absl::OkStatus();
}

absl::Status CheckGraph(const Graph& g, const DeviceInfo& device) {
  if (g.calls.empty()) return absl::InvalidArgumentError("graph has no calls");
  if (absl::Status s = CheckGraphLimits(g.variables.size(), g.slots.size(), g.calls.size()); !s.ok()) return s;
  absl::flat_hash_set<std::string> names;
  for (const VariableDecl& v : g.variables) {
    if (absl::Status s = CheckVariable(v); !s.ok()) return s;
    if (!names.insert(v.name).second)
      return absl::InvalidArgumentError(absl::StrCat("variable ", v.name, " is declared twice"));
  }
  for (size_t i = 0; i < g.slots.size(); ++i) {
    const Slot& s = g.slots[i];
    if (s.kind == SlotKind::kConstant && !s.constant)
      return absl::InvalidArgumentError(absl::StrCat("slot ", i, ": a constant needs a buffer"));
    if (s.bytes == 0) return absl::InvalidArgumentError(absl::StrCat("slot ", i, " has 0 bytes"));
    if (s.bytes > device.total_memory)
      return absl::ResourceExhaustedError(
          absl::StrCat("slot ", i, " of ", s.bytes, " bytes exceeds ", device.id, "'s memory"));
  }
  for (size_t i = 0; i < g.calls.size(); ++i)
    if (absl::Status s = CheckCall(g, i, device); !s.ok()) return s;
  return absl::OkStatus();
}

std::string GraphStructure(const Graph& g, uint64_t address_space) {
  std::string out = "replayd-graph-v2";
  Append(out, static_cast<int64_t>(address_space));
  Append(out, static_cast<int64_t>(g.variables.size()));
  for (const VariableDecl& v : g.variables) {
    Append(out, v.min);
    Append(out, v.max);
    Append(out, v.multiple_of);
  }
  Append(out, static_cast<int64_t>(g.slots.size()));
  for (const Slot& s : g.slots) {
    out.push_back(static_cast<char>(s.kind));
    Append(out, static_cast<int64_t>(s.bytes));
    if (s.kind == SlotKind::kConstant) Append(out, static_cast<int64_t>(s.constant->allocation.address));
  }
  Append(out, static_cast<int64_t>(g.calls.size()));
  for (const GraphCall& c : g.calls) {
    if (c.is_copy()) {
      out.push_back('c');
    } else {
      out.push_back('k');
      out.append(c.program->key);
    }
    Append(out, static_cast<int64_t>(c.args.size()));
    for (const GraphArg& a : c.args) {
      if (const SlotView* v = std::get_if<SlotView>(&a)) {
        out.push_back('v');
        Append(out, v->slot);
        Append(out, static_cast<int64_t>(v->offset));
        Append(out, static_cast<int64_t>(v->length ? v->length : g.slots[v->slot].bytes - v->offset));
      } else {
        out.push_back('e');
        Append(out, std::get<Expression>(a));
      }
    }
    for (const Expression& e : c.global) Append(out, e);
    for (const Expression& e : c.local) Append(out, e);
  }
  return out;
}

std::string GraphKey(const std::string& structure) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(structure.data(), structure.size(), digest, &len, EVP_sha256(), nullptr);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), len));
}

}  // namespace replayd
