#include "demo.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/decode_geometry.h"
#include "client/decode_model.h"

namespace replayd::client {
namespace {

using decode::kCtx;
using decode::kD;
using decode::kFf;
using decode::kHeads;
using decode::kLayers;
using decode::kVocab;

constexpr double kTolerance = 1e-4;
constexpr int64_t kBos = 1;

const Variable kPosVar{"pos", 1, kCtx, 1};

// A geometry's dimensions for a LaunchSpec, `pos` as the variable's expression.
Dim ToDim(const decode::Extent& e) { return e.is_pos ? Dim{Expr{kPosVar.name}} : Dim{uint64_t(e.constant)}; }

std::vector<Dim> GlobalDims(const decode::Geometry& g) {
  return {ToDim(g.global[0]), ToDim(g.global[1]), ToDim(g.global[2])};
}

std::vector<Dim> LocalDims(const decode::Geometry& g) {
  return {uint64_t(g.local[0]), uint64_t(g.local[1]), uint64_t(g.local[2])};
}

// The model's state on the device: programs, weights and the KV cache in session buffers.
class DeviceModel {
 public:
  // `device` picks the kernels: the GPU source as cuda-c or hip-c on GPUs, C on the CPU.
  DeviceModel(Session& s, const std::string& device)
      : s_(s),
        gpu_format_(device.rfind("cuda:", 0) == 0  ? "cuda-c"
                    : device.rfind("hip:", 0) == 0 ? "hip-c"
                                                   : ""),
        set_(gpu_format_.empty() ? decode::KernelSet::kCpu : decode::KernelSet::kGpu) {}

  absl::Status Load(const decode::Weights& w, int* cache_hits, double* compile_seconds) {
    struct Def {
      const char* entry;
      const char* signature;
      bool core;
    };
    const Def defs[] = {{"embed", "out,in,in,in,int32,int32", false},
                        {"argmax", "out,in,int32", false},
                        {"rmsnorm", "out,in,in,int32", false},
                        {"matvec", "inout,in,in,int32,int32,int32,int32", true},
                        {"kv_store", "inout,inout,in,int32,int32", false},
                        {"attn_scores", "out,in,in,int32,int32,int32,int32", true},
                        {"attn_softmax", "inout,int32,int32", true},
                        {"attn_mix", "out,in,in,int32,int32,int32,int32", true}};
    // NVRTC fuses a multiply and an add into one FMA by default (--fmad=true), and hiprtc contracts them likewise.
    // With that off, the GPU rounds every product and every sum as the host reference does, so its logits differ from
    // the reference only by the order in which the kernels' parallel reductions add, which the tolerance allows for.
    const std::vector<std::string> gpu_options = {gpu_format_ == "hip-c" ? "-ffp-contract=off" : "--fmad=false"};
    for (const Def& d : defs) {
      // On a GPU the invocation index is the block index, not an argument.
      absl::StatusOr<v1::Signature> sig = ParseSignature(d.signature, d.core && set_ == decode::KernelSet::kCpu);
      if (!sig.ok()) return sig.status();
      absl::StatusOr<Program> p = set_ == decode::KernelSet::kGpu
                                      ? s_.Load({gpu_format_, DemoKernel("decode.cu"), d.entry, *sig, gpu_options})
                                      : s_.Load({"cpu-c", DemoKernel("decode.c"), d.entry, *sig, {"-O2"}});
      if (!p.ok()) return p.status();
      *cache_hits += p->info().cache_hit();
      *compile_seconds += p->info().compile_seconds();
      programs_.emplace(d.entry, std::move(*p));
    }
    auto upload = [&](const std::vector<float>& v) -> absl::StatusOr<Buffer> {
      absl::StatusOr<Buffer> b = s_.Alloc(v.size() * sizeof(float));
      if (!b.ok()) return b;
      weight_bytes_ += v.size() * sizeof(float);
      if (absl::Status st = s_.WriteVector(*b, v); !st.ok()) return st;
      return b;
    };
    std::vector<const std::vector<float>*> all = {&w.tok_emb, &w.pos_emb, &w.lnf, &w.wout};
    for (const auto& L : w.layers)
      for (const auto* v : {&L.ln1, &L.wqkv, &L.wo, &L.ln2, &L.w1, &L.w2}) all.push_back(v);
    for (const auto* v : all) {
      absl::StatusOr<Buffer> b = upload(*v);
      if (!b.ok()) return b.status();
      weights_.push_back(std::move(*b));
    }
    for (int l = 0; l < 2 * kLayers; ++l) {
      absl::StatusOr<Buffer> b = s_.Alloc(size_t{kCtx} * kD * sizeof(float));
      if (!b.ok()) return b.status();
      kv_.push_back(std::move(*b));
    }
    return absl::OkStatus();
  }

  // Temporaries of one layer.
  struct LayerScratch {
    Buffer h, qkv, scores, att, ff;
  };
  // Temporaries of one step: the residual stream, each layer's, and the final norm's.
  // Within a capture every layer gets its own, so the memory plan can share their bytes.
  struct Scratch {
    Buffer x, h;
    std::vector<LayerScratch> layers;
  };

  absl::StatusOr<Scratch> AllocScratch(int layer_sets) {
    Scratch sc;
    auto alloc = [&](Buffer* b, int floats) {
      absl::StatusOr<Buffer> a = s_.Alloc(uint64_t(floats) * sizeof(float));
      if (a.ok()) *b = std::move(*a);
      return a.status();
    };
    absl::Status st = alloc(&sc.x, kD);
    if (st.ok()) st = alloc(&sc.h, kD);
    sc.layers.resize(layer_sets);
    for (LayerScratch& l : sc.layers) {
      for (auto [b, floats] :
           {std::pair{&l.h, kD}, {&l.qkv, 3 * kD}, {&l.scores, kHeads * kCtx}, {&l.att, kD}, {&l.ff, kFf}})
        if (st.ok()) st = alloc(b, floats);
    }
    if (!st.ok()) return st;
    return sc;
  }

  // Launches one decode step: the embedding of tok[0] at pos, 10 calls per layer, the
  // final norm, the logits, and the argmax written back into tok. Every launch takes its
  // geometry from client/decode_geometry.h.
  absl::Status Step(const Scratch& sc, const Buffer& tok, const Buffer& logits, int64_t pos) {
    const std::vector<BoundVariable> vars = {{kPosVar, pos}};
    auto launch = [&](const char* entry, std::vector<KernelArg> args, const decode::Geometry& g) {
      LaunchSpec spec;
      spec.args = std::move(args);
      spec.global = GlobalDims(g);
      spec.local = LocalDims(g);
      spec.variables = vars;
      return s_.Launch(programs_.at(entry), spec).status();
    };
    const int64_t chunk = decode::MatVecChunk(set_);
    auto matvec = [&](const Buffer& out, const Buffer& x, const Buffer& w, int rows, int cols, int mode) {
      return launch("matvec", {View{&out}, View{&x}, View{&w}, int64_t{rows}, int64_t{cols}, chunk, int64_t{mode}},
                    decode::MatVecGeometry(set_, cols));
    };
    const int64_t d = kD, heads = kHeads, ctx = kCtx;
    const Expr p{kPosVar.name};
    absl::Status st = launch("embed", {View{&sc.x}, View{&weights_[0]}, View{&weights_[1]}, View{&tok}, p, d},
                             decode::EmbedGeometry(set_));
    for (int l = 0; l < kLayers && st.ok(); ++l) {
      const Buffer* L = &weights_[4 + 6 * l];
      const Buffer &k = kv_[2 * l], &v = kv_[2 * l + 1];
      const LayerScratch& t = sc.layers[l % sc.layers.size()];
      if (st.ok()) st = launch("rmsnorm", {View{&t.h}, View{&sc.x}, View{&L[0]}, d}, decode::RmsNormGeometry(set_));
      if (st.ok()) st = matvec(t.qkv, t.h, L[1], kD, 3 * kD, 0);
      if (st.ok()) st = launch("kv_store", {View{&k}, View{&v}, View{&t.qkv}, p, d}, decode::KvStoreGeometry(set_));
      if (st.ok())
        st = launch("attn_scores", {View{&t.scores}, View{&t.qkv}, View{&k}, p, d, heads, ctx},
                    decode::AttnScoresGeometry(set_, kHeads));
      if (st.ok()) st = launch("attn_softmax", {View{&t.scores}, p, ctx}, decode::AttnSoftmaxGeometry(set_, kHeads));
      if (st.ok())
        st = launch("attn_mix", {View{&t.att}, View{&t.scores}, View{&v}, p, d, heads, ctx},
                    decode::AttnMixGeometry(set_, kHeads));
      if (st.ok()) st = matvec(sc.x, t.att, L[2], kD, kD, 1);
      if (st.ok()) st = launch("rmsnorm", {View{&t.h}, View{&sc.x}, View{&L[3]}, d}, decode::RmsNormGeometry(set_));
      if (st.ok()) st = matvec(t.ff, t.h, L[4], kD, kFf, 2);
      if (st.ok()) st = matvec(sc.x, t.ff, L[5], kFf, kD, 1);
    }
    if (st.ok())
      st = launch("rmsnorm", {View{&sc.h}, View{&sc.x}, View{&weights_[2]}, d}, decode::RmsNormGeometry(set_));
    if (st.ok()) st = matvec(logits, sc.h, weights_[3], kD, kVocab, 0);
    if (st.ok()) st = launch("argmax", {View{&tok}, View{&logits}, int64_t{kVocab}}, decode::ArgmaxGeometry(set_));
    return st;
  }

  uint64_t weight_bytes() const { return weight_bytes_; }
  size_t program_count() const { return programs_.size(); }

 private:
  Session& s_;
  const std::string gpu_format_;  // empty on the CPU
  const decode::KernelSet set_;
  std::map<std::string, Program> programs_;
  std::vector<Buffer> weights_, kv_;
  uint64_t weight_bytes_ = 0;
};

std::vector<float> ToFloats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

double MaxError(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) e = std::max(e, std::abs(double(a[i]) - double(b[i])));
  return a.size() == b.size() ? e : INFINITY;
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5))];
}

double Millis(std::chrono::steady_clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

int64_t TokenOf(const std::string& bytes) {
  int32_t t = 0;
  std::memcpy(&t, bytes.data(), std::min(bytes.size(), sizeof t));
  return t;
}

// One way of generating: its per-token latencies (when it has them) and its wall time.
struct ModeResult {
  std::vector<double> ms;
  double seconds = 0;
};

}  // namespace

absl::Status RunDemo(Client& client, const DemoOptions& options, std::ostream& out) {
  if (options.tokens < 1 || options.tokens > kCtx)
    return absl::InvalidArgumentError(absl::StrCat("--tokens must be in [1, ", kCtx, "]"));
  const int n = options.tokens;
  absl::StatusOr<Session> session = client.OpenSession(options.device);
  if (!session.ok()) return session.status();
  const decode::Weights weights = decode::Weights::Make();
  DeviceModel model(*session, options.device);
  int hits = 0;
  double compile_s = 0;
  if (absl::Status s = model.Load(weights, &hits, &compile_s); !s.ok()) return s;
  absl::StatusOr<Buffer> logits = session->Alloc(kVocab * sizeof(float));
  absl::StatusOr<Buffer> tok = session->Alloc(sizeof(int32_t));
  if (!logits.ok()) return logits.status();
  if (!tok.ok()) return tok.status();
  auto reset_token = [&] { return session->WriteVector(*tok, std::vector<int32_t>{int32_t(kBos)}); };

  // Capture one decode step with the variable pos (it runs, too: pos 1, the first token).
  if (absl::Status s = reset_token(); !s.ok()) return s;
  if (absl::Status s = session->BeginCapture({&*tok}, {kPosVar}); !s.ok()) return s;
  {
    absl::StatusOr<DeviceModel::Scratch> scratch = model.AllocScratch(kLayers);  // internals
    if (!scratch.ok()) return scratch.status();
    if (absl::Status s = model.Step(*scratch, *tok, *logits, 1); !s.ok()) return s;
  }
  absl::StatusOr<Graph> graph = session->EndCapture({&*logits});
  if (!graph.ok()) return graph.status();
  const uint64_t instantiations_at_capture = graph->info().cache().instantiations();
  const std::vector<View> reads = {View{&*logits}, View{&*tok}};

  // The reference, step by step, following the tokens the device picks.
  decode::HostModel host(weights);
  std::vector<std::vector<float>> expected;
  std::vector<int64_t> tokens = {kBos};
  double max_err = 0;
  auto check = [&](int step, const std::vector<std::string>& r) {
    const std::vector<float> got = ToFloats(r[0]);
    if (step == int(expected.size())) {
      expected.push_back(host.Step(step + 1, int(tokens[step])));
      tokens.push_back(TokenOf(r[1]));
    } else if (TokenOf(r[1]) != tokens[step + 1]) {
      max_err = INFINITY;  // a different token than the first generation chose
    }
    max_err = std::max(max_err, MaxError(got, expected[step]));
  };

  // 1. One replay per token, each a round trip on the session stream.
  ModeResult per_step;
  if (absl::Status s = reset_token(); !s.ok()) return s;  // the capture's argmax moved it on
  auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < n; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<ReplayResult> r = session->Replay(*graph, {&*tok, &*logits, int64_t{step + 1}}, false, reads);
    if (!r.ok()) return r.status();
    per_step.ms.push_back(Millis(std::chrono::steady_clock::now() - t0));
    check(step, r->reads);
  }
  per_step.seconds = Millis(std::chrono::steady_clock::now() - start) / 1e3;

  // 2. Pipelined: every replay queued before waiting for any. No step needs the client,
  //    since the device writes each next token into tok.
  ModeResult pipelined;
  if (absl::Status s = reset_token(); !s.ok()) return s;
  start = std::chrono::steady_clock::now();
  std::vector<std::future<absl::StatusOr<ReplayResult>>> futures;
  for (int step = 0; step < n; ++step)
    futures.push_back(session->ReplayAsync(*graph, {&*tok, &*logits, int64_t{step + 1}}, false, reads));
  for (int step = 0; step < n; ++step) {
    absl::StatusOr<ReplayResult> r = futures[step].get();
    if (!r.ok()) return r.status();
    check(step, r->reads);
  }
  pipelined.seconds = Millis(std::chrono::steady_clock::now() - start) / 1e3;

  // 3. One replay sequence: pos steps from 1, each replay's reads streamed back.
  ModeResult sequence;
  if (absl::Status s = reset_token(); !s.ok()) return s;
  SequenceSpec spec;
  spec.base = {&*tok, &*logits, int64_t{1}};
  spec.step_param = 2;
  spec.step = 1;
  spec.count = uint32_t(n);
  spec.reads = reads;
  spec.stream_reads = true;
  start = std::chrono::steady_clock::now();
  absl::StatusOr<SequenceResult> seq =
      session->ReplaySequence(*graph, spec, [&](uint32_t index, std::vector<std::string> r) { check(int(index), r); });
  if (!seq.ok()) return seq.status();
  sequence.seconds = Millis(std::chrono::steady_clock::now() - start) / 1e3;

  // The same steps run eagerly, one Launch RPC per call, for comparison. They rewrite
  // the KV cache rows of the first positions with the values they already hold.
  ModeResult eager;
  absl::StatusOr<DeviceModel::Scratch> scratch = model.AllocScratch(1);
  if (!scratch.ok()) return scratch.status();
  if (absl::Status s = reset_token(); !s.ok()) return s;
  for (int pos = 1; pos <= std::min(options.eager_steps, n); ++pos) {
    auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = model.Step(*scratch, *tok, *logits, pos); !s.ok()) return s;
    absl::StatusOr<std::vector<float>> got = session->ReadVector<float>(*logits, kVocab);
    if (!got.ok()) return got.status();
    eager.ms.push_back(Millis(std::chrono::steady_clock::now() - t0));
    max_err = std::max(max_err, MaxError(*got, expected[pos - 1]));
  }
  absl::StatusOr<v1::GraphReply> info = session->DescribeGraph(*graph);
  if (!info.ok()) return info.status();

  out << absl::StrFormat("replayd decode demo on %s: %d layers, width %d, %d heads, vocabulary %d, context %d\n",
                         options.device, kLayers, kD, kHeads, kVocab, kCtx);
  out << absl::StrFormat(
      "programs: %d loaded, %d from the compile cache, %.2f s compiling; "
      "weights %.1f MiB in constant buffers\n",
      model.program_count(), hits, compile_s, model.weight_bytes() / 1048576.0);
  out << absl::StrFormat("graph %s: %d calls, %d batch(es) per step, arena %d bytes, plan saved %d bytes\n",
                         info->key().substr(0, 16), info->calls(), info->batches(), info->arena_bytes(),
                         info->plan_saved_bytes());
  out << "tokens:";
  for (size_t i = 1; i < tokens.size() && i <= 16; ++i) out << " " << tokens[i];
  out << (tokens.size() > 17 ? " ...\n" : "\n");
  out << absl::StrFormat("%-34s %9s %9s %10s\n", "", "p50 ms", "p99 ms", "tokens/s");
  auto row = [&](const std::string& name, const ModeResult& m, int count) {
    std::string p50 = m.ms.empty() ? "-" : absl::StrFormat("%.3f", Percentile(m.ms, 0.5));
    std::string p99 = m.ms.empty() ? "-" : absl::StrFormat("%.3f", Percentile(m.ms, 0.99));
    out << absl::StrFormat("%-34s %9s %9s %10.1f\n", name, p50, p99, count / m.seconds);
  };
  row("replay, one round trip per token", per_step, n);
  row("replay, pipelined", pipelined, n);
  row("replay sequence, one request", sequence, n);
  eager.seconds = 0;
  for (double ms : eager.ms) eager.seconds += ms / 1e3;
  row(absl::StrCat("eager, ", info->calls() + 1, " RPCs per token"), eager, int(eager.ms.size()));
  out << absl::StrFormat("instantiations %d (at capture; %d more during generation), replays %d\n",
                         graph->info().cache_hit() ? 0 : 1, info->cache().instantiations() - instantiations_at_capture,
                         info->replays());
  out << absl::StrFormat(
      "logits against the host reference at every step of every mode: max |error| %.3g "
      "(tolerance %.0e): %s\n",
      max_err, kTolerance, max_err <= kTolerance ? "OK" : "FAILED");
  if (max_err > kTolerance) return absl::FailedPreconditionError(absl::StrCat("decode logits off by ", max_err));
  return absl::OkStatus();
}

}  // namespace replayd::client
