#include "demo.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace replayd::client {
namespace {

constexpr int kN = 256;
constexpr double kTolerance = 1e-5;

std::vector<float> PseudoRandom(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t x = seed;
  for (auto& f : v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>((x >> 8) & 0xffff) / 65536.0f - 0.5f;
  }
  return v;
}

std::vector<float> HostReference(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> c(kN * kN, 0.0f), y(kN * kN);
  for (int i = 0; i < kN; ++i)
    for (int k = 0; k < kN; ++k)
      for (int j = 0; j < kN; ++j) c[i * kN + j] += a[i * kN + k] * b[k * kN + j];
  for (int i = 0; i < kN; ++i) {
    float m = c[i * kN];
    for (int j = 1; j < kN; ++j) m = std::max(m, c[i * kN + j]);
    double s = 0;
    for (int j = 0; j < kN; ++j) s += std::exp(double(c[i * kN + j]) - m);
    for (int j = 0; j < kN; ++j) y[i * kN + j] = float(std::exp(double(c[i * kN + j]) - m) / s);
  }
  return y;
}

struct Step {
  std::string name;
  double device_ms = 0;
  double round_trip_ms = 0;
};

}  // namespace

absl::Status RunDemo(Client& client, const std::string& device, std::ostream& out) {
  absl::StatusOr<Session> session = client.OpenSession(device);
  if (!session.ok()) return session.status();
  const bool core_id = true;
  struct KernelDef { const char* file; const char* entry; const char* signature; };
  const KernelDef defs[] = {{"matmul", "matmul", "out,in,in,int32"},
                            {"softmax", "row_max", "out,in,int32"},
                            {"softmax", "exp_sub", "out,in,in,int32"},
                            {"softmax", "row_sum", "out,in,int32"},
                            {"softmax", "normalize", "out,in,in,int32"}};
  std::vector<Program> programs;
  double compile_s = 0;
  int hits = 0;
  for (const auto& def : defs) {
    ProgramSpec spec;
    spec.code = DemoKernel(def.file);
    spec.entry = def.entry;
    absl::StatusOr<v1::Signature> sig = ParseSignature(def.signature, core_id);
    if (!sig.ok()) return sig.status();
    spec.signature = *sig;
    spec.options = {"-O2"};
    absl::StatusOr<Program> p = session->Load(spec);
    if (!p.ok()) return p.status();
    compile_s += p->info().compile_seconds();
    hits += p->info().cache_hit();
    programs.push_back(std::move(*p));
  }

  const uint64_t matrix = uint64_t{kN} * kN * sizeof(float);
  const uint64_t vec = uint64_t{kN} * sizeof(float);
  std::vector<Buffer> buffers;
  for (uint64_t bytes : {matrix, matrix, matrix, vec, matrix, vec, matrix}) {
    absl::StatusOr<Buffer> b = session->Alloc(bytes);
    if (!b.ok()) return b.status();
    buffers.push_back(std::move(*b));
  }
  Buffer &a = buffers[0], &b = buffers[1], &c = buffers[2], &m = buffers[3], &e = buffers[4],
         &s = buffers[5], &y = buffers[6];
  std::vector<float> host_a = PseudoRandom(kN * kN, 1), host_b = PseudoRandom(kN * kN, 2);
  if (absl::Status st = session->WriteVector(a, host_a); !st.ok()) return st;
  if (absl::Status st = session->WriteVector(b, host_b); !st.ok()) return st;

  const int64_t n = kN;
  const std::vector<std::vector<KernelArg>> args = {
      {View{&c}, View{&a}, View{&b}, n},
      {View{&m}, View{&c}, n},
      {View{&e}, View{&c}, View{&m}, n},
      {View{&s}, View{&e}, n},
      {View{&y}, View{&e}, View{&s}, n}};
  std::vector<Step> steps;
  for (size_t i = 0; i < programs.size(); ++i) {
    auto start = std::chrono::steady_clock::now();
    absl::StatusOr<v1::LaunchReply> r =
        session->Launch(programs[i], args[i], {uint64_t{kN}, 1, 1}, {1, 1, 1}, /*wait=*/true);
    if (!r.ok()) return r.status();
    double rt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    steps.push_back({defs[i].entry, r->device_seconds() * 1e3, rt});
  }
  absl::StatusOr<std::vector<float>> result = session->ReadVector<float>(y, kN * kN);
  if (!result.ok()) return result.status();
  std::vector<float> expected = HostReference(host_a, host_b);
  double max_err = 0;
  for (size_t i = 0; i < expected.size(); ++i)
    max_err = std::max(max_err, std::abs(double((*result)[i]) - expected[i]));

  out << absl::StrFormat("replayd demo on %s: %dx%d matmul, then row softmax (5 kernels)\n",
                         device, kN, kN);
  out << absl::StrFormat("programs: %d loaded, %d from the compile cache, %.3f s compiling\n",
                         programs.size(), hits, compile_s);
  out << absl::StrFormat("%-10s %12s %14s\n", "kernel", "device ms", "round trip ms");
  for (const auto& st : steps)
    out << absl::StrFormat("%-10s %12.3f %14.3f\n", st.name, st.device_ms, st.round_trip_ms);
  out << absl::StrFormat("max |error| against the host reference: %.3g (tolerance %.0e): %s\n",
                         max_err, kTolerance, max_err <= kTolerance ? "OK" : "FAILED");
  if (max_err > kTolerance)
    return absl::FailedPreconditionError(absl::StrCat("demo result off by ", max_err));
  return absl::OkStatus();
}

}  // namespace replayd::client
