#include "drivers/amdgpu_metadata.h"

#include <elf.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "drivers/elf_image.h"

namespace replayd {
namespace {

constexpr uint32_t kNtAmdgpuMetadata = 32;
constexpr absl::string_view kNoteName("AMDGPU\0", 7);
constexpr absl::string_view kBundleMagic = "__CLANG_OFFLOAD_BUNDLE__";

// A MessagePack reader over bytes that may be anything: every read checks its bounds, a
// read of the wrong kind fails, and Skip walks nested values without recursion.
class MsgPack {
 public:
  explicit MsgPack(absl::string_view data) : data_(data) {}

  bool Map(uint64_t* n) { return Expect(Kind::kMap, n); }
  bool Array(uint64_t* n) { return Expect(Kind::kArray, n); }
  bool String(absl::string_view* s) {
    uint64_t n = 0;
    return Expect(Kind::kString, &n) && Take(n, s);
  }
  // A non-negative integer, in whichever width it was written.
  bool Uint(uint64_t* v) {
    Kind kind;
    if (!Header(&kind, v)) return false;
    return kind == Kind::kUint || (kind == Kind::kInt && static_cast<int64_t>(*v) >= 0);
  }
  // Past the next value, whatever it holds.
  bool Skip() {
    uint64_t pending = 1;
    while (pending > 0) {
      --pending;
      Kind kind;
      uint64_t n = 0;
      if (!Header(&kind, &n)) return false;
      if (kind == Kind::kString || kind == Kind::kBinary || kind == Kind::kFloat || kind == Kind::kExt) {
        if (!Take(n, nullptr)) return false;
      } else if (kind == Kind::kArray) {
        pending += n;
      } else if (kind == Kind::kMap) {
        pending += 2 * n;  // n < 2^32
      }
      if (pending > data_.size() - at_) return false;  // every value takes a byte at least
    }
    return true;
  }

 private:
  enum class Kind { kNil, kBool, kUint, kInt, kFloat, kString, kBinary, kExt, kArray, kMap };

  bool Expect(Kind want, uint64_t* n) {
    Kind kind;
    return Header(&kind, n) && kind == want;
  }
  bool Take(uint64_t n, absl::string_view* out) {
    if (n > data_.size() - at_) return false;
    if (out) *out = data_.substr(at_, n);
    at_ += n;
    return true;
  }
  // A big-endian unsigned integer of `bytes` bytes.
  bool BigEndian(int bytes, uint64_t* v) {
    absl::string_view b;
    if (!Take(bytes, &b)) return false;
    *v = 0;
    for (char c : b) *v = *v << 8 | static_cast<uint8_t>(c);
    return true;
  }
  // The next value's kind and its count (array, map), length (string, binary, float,
  // extension: the payload that follows, not yet read) or value (integers, booleans).
  bool Header(Kind* kind, uint64_t* n) {
    absl::string_view first;
    if (!Take(1, &first)) return false;
    const uint8_t b = static_cast<uint8_t>(first[0]);
    auto is = [&](Kind k, uint64_t v) {
      *kind = k;
      *n = v;
      return true;
    };
    if (b <= 0x7f) return is(Kind::kUint, b);
    if (b >= 0xe0) return is(Kind::kInt, static_cast<uint64_t>(int64_t{static_cast<int8_t>(b)}));
    if (b <= 0x8f) return is(Kind::kMap, b & 0x0f);
    if (b <= 0x9f) return is(Kind::kArray, b & 0x0f);
    if (b <= 0xbf) return is(Kind::kString, b & 0x1f);
    auto sized = [&](Kind k, int bytes) {
      *kind = k;
      return BigEndian(bytes, n);
    };
    auto ext = [&](int bytes) {  // a length, then a type byte before the payload
      *kind = Kind::kExt;
      uint64_t type = 0;
      return BigEndian(bytes, n) && BigEndian(1, &type);
    };
    auto signed_int = [&](int bytes) {
      *kind = Kind::kInt;
      if (!BigEndian(bytes, n)) return false;
      const int shift = 64 - 8 * bytes;
      if (shift > 0) *n = static_cast<uint64_t>(static_cast<int64_t>(*n << shift) >> shift);
      return true;
    };
    switch (b) {
      case 0xc0: return is(Kind::kNil, 0);
      case 0xc2: case 0xc3: return is(Kind::kBool, b & 1);
      case 0xc4: return sized(Kind::kBinary, 1);
      case 0xc5: return sized(Kind::kBinary, 2);
      case 0xc6: return sized(Kind::kBinary, 4);
      case 0xc7: return ext(1);
      case 0xc8: return ext(2);
      case 0xc9: return ext(4);
      case 0xca: return is(Kind::kFloat, 4);
      case 0xcb: return is(Kind::kFloat, 8);
      case 0xcc: return sized(Kind::kUint, 1);
      case 0xcd: return sized(Kind::kUint, 2);
      case 0xce: return sized(Kind::kUint, 4);
      case 0xcf: return sized(Kind::kUint, 8);
      case 0xd0: return signed_int(1);
      case 0xd1: return signed_int(2);
      case 0xd2: return signed_int(4);
      case 0xd3: return signed_int(8);
      case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: {
        *kind = Kind::kExt;
        *n = uint64_t{1} << (b - 0xd4);
        uint64_t type = 0;
        return BigEndian(1, &type);
      }
      case 0xd9: return sized(Kind::kString, 1);
      case 0xda: return sized(Kind::kString, 2);
      case 0xdb: return sized(Kind::kString, 4);
      case 0xdc: return sized(Kind::kArray, 2);
      case 0xdd: return sized(Kind::kArray, 4);
      case 0xde: return sized(Kind::kMap, 2);
      case 0xdf: return sized(Kind::kMap, 4);
      default: return false;  // 0xc1 is never used
    }
  }

  absl::string_view data_;
  size_t at_ = 0;
};

// [offset, offset + size) within `limit` bytes, without overflow.
bool Within(uint64_t offset, uint64_t size, uint64_t limit) { return offset <= limit && size <= limit - offset; }

template <typename T>
T Read(absl::string_view bytes, uint64_t at) {
  T v;
  std::memcpy(&v, bytes.data() + at, sizeof v);
  return v;
}

// One kernel's map in "amdhsa.kernels"; `*matches` when it is `entry`'s.
bool ReadKernel(MsgPack& m, absl::string_view entry, bool* matches, AmdgpuKernelInfo* info) {
  uint64_t fields = 0;
  if (!m.Map(&fields)) return false;
  absl::string_view name, symbol;
  bool seen_name = false, seen_symbol = false, seen_args = false, seen_bound = false, seen_kernarg_size = false,
       seen_kernarg_align = false;
  // A key given twice is refused: which one a runtime's reader keeps is its own choice.
  auto first = [](bool* seen) { return !std::exchange(*seen, true); };
  for (uint64_t f = 0; f < fields; ++f) {
    absl::string_view key;
    if (!m.String(&key)) return false;
    if (key == ".name") {
      if (!first(&seen_name) || !m.String(&name)) return false;
    } else if (key == ".symbol") {
      if (!first(&seen_symbol) || !m.String(&symbol)) return false;
    } else if (key == ".max_flat_workgroup_size") {
      if (!first(&seen_bound) || !m.Uint(&info->max_flat_workgroup_size)) return false;
    } else if (key == ".kernarg_segment_size") {
      if (!first(&seen_kernarg_size) || !m.Uint(&info->kernarg_segment_size)) return false;
    } else if (key == ".kernarg_segment_align") {
      if (!first(&seen_kernarg_align) || !m.Uint(&info->kernarg_segment_align)) return false;
    } else if (key == ".args") {
      uint64_t count = 0;
      if (!first(&seen_args) || !m.Array(&count)) return false;
      for (uint64_t a = 0; a < count; ++a) {
        uint64_t arg_fields = 0, size = 0;
        absl::string_view kind;
        bool seen_size = false, seen_kind = false;
        if (!m.Map(&arg_fields)) return false;
        for (uint64_t af = 0; af < arg_fields; ++af) {
          absl::string_view arg_key;
          if (!m.String(&arg_key)) return false;
          if (arg_key == ".size") {
            if (!first(&seen_size) || !m.Uint(&size)) return false;
          } else if (arg_key == ".value_kind") {
            if (!first(&seen_kind) || !m.String(&kind)) return false;
          } else if (!m.Skip()) {
            return false;
          }
        }
        if (!seen_size || !seen_kind) return false;
        if (absl::StartsWith(kind, "hidden_")) continue;
        info->arg_sizes.push_back(size);
        info->arg_kinds.emplace_back(kind);
      }
    } else if (!m.Skip()) {
      return false;
    }
  }
  *matches = (seen_symbol && symbol == absl::StrCat(entry, ".kd")) || (seen_name && name == entry);
  return true;
}

using Bad = absl::FunctionRef<absl::Status(absl::string_view)>;

// What the metadata `note` says of `entry`; nullopt when it describes no such kernel.
absl::StatusOr<std::optional<AmdgpuKernelInfo>> FromMetadata(absl::string_view note, absl::string_view entry, Bad bad) {
  MsgPack m(note);
  uint64_t keys = 0;
  if (!m.Map(&keys)) return bad("its metadata is not a MessagePack map");
  std::optional<AmdgpuKernelInfo> found;
  bool seen_kernels = false;
  for (uint64_t k = 0; k < keys; ++k) {
    absl::string_view key;
    if (!m.String(&key)) return bad("its metadata is malformed");
    if (key != "amdhsa.kernels") {
      if (!m.Skip()) return bad("its metadata is malformed");
      continue;
    }
    uint64_t count = 0;
    if (std::exchange(seen_kernels, true) || !m.Array(&count)) return bad("its metadata's amdhsa.kernels is malformed");
    for (uint64_t i = 0; i < count; ++i) {
      AmdgpuKernelInfo info;
      bool matches = false;
      if (!ReadKernel(m, entry, &matches, &info)) return bad("its metadata's amdhsa.kernels is malformed");
      if (!matches) continue;
      if (found) return bad(absl::StrCat("its metadata describes kernel ", entry, " twice"));
      found = std::move(info);
    }
  }
  return found;
}

// The NT_AMDGPU_METADATA note of a code object, from its PT_NOTE segments and its
// SHT_NOTE sections alike: a loader may read either, so where both hold one they must be
// the same bytes.
absl::StatusOr<absl::string_view> MetadataNote(absl::string_view image, Bad bad) {
  if (absl::Status s = CheckElfImage(image, kElfMachineAmdgpu, "code object"); !s.ok()) return bad(s.message());
  const auto eh = Read<Elf64_Ehdr>(image, 0);
  std::vector<absl::string_view> found;
  bool malformed = false;
  auto scan = [&](uint64_t offset, uint64_t size, uint64_t align) {
    if (!Within(offset, size, image.size())) return void(malformed = true);
    const uint64_t pad = align == 8 ? 8 : 4;
    auto round = [pad](uint64_t n) { return (n + pad - 1) / pad * pad; };
    const absl::string_view notes = image.substr(offset, size);
    for (uint64_t at = 0; notes.size() - at >= sizeof(Elf64_Nhdr);) {
      const auto nh = Read<Elf64_Nhdr>(notes, at);
      at += sizeof nh;
      if (nh.n_namesz > notes.size() - at) return void(malformed = true);
      const absl::string_view name = notes.substr(at, nh.n_namesz);
      at = std::min<uint64_t>(at + round(nh.n_namesz), notes.size());
      if (nh.n_descsz > notes.size() - at) return void(malformed = true);
      const absl::string_view desc = notes.substr(at, nh.n_descsz);
      at = std::min<uint64_t>(at + round(nh.n_descsz), notes.size());
      if (nh.n_type == kNtAmdgpuMetadata && name == kNoteName) found.push_back(desc);
    }
  };
  for (uint16_t i = 0; i < eh.e_phnum; ++i) {
    const auto ph = Read<Elf64_Phdr>(image, eh.e_phoff + uint64_t{i} * sizeof(Elf64_Phdr));
    if (ph.p_type == PT_NOTE) scan(ph.p_offset, ph.p_filesz, ph.p_align);
  }
  for (uint16_t i = 0; i < eh.e_shnum; ++i) {
    const auto sh = Read<Elf64_Shdr>(image, eh.e_shoff + uint64_t{i} * sizeof(Elf64_Shdr));
    if (sh.sh_type == SHT_NOTE) scan(sh.sh_offset, sh.sh_size, sh.sh_addralign);
  }
  if (malformed) return bad("a note of it passes its end");
  if (found.empty()) return bad("it has no AMDGPU metadata note (code objects of version 3 and later carry one)");
  for (absl::string_view other : found)
    if (other != found[0]) return bad("it has two AMDGPU metadata notes that differ");
  return found[0];
}

absl::StatusOr<std::optional<AmdgpuKernelInfo>> FromCodeObject(absl::string_view image, absl::string_view entry,
                                                                Bad bad) {
  absl::StatusOr<absl::string_view> note = MetadataNote(image, bad);
  if (!note.ok()) return note.status();
  return FromMetadata(*note, entry, bad);
}

// Each AMDGPU code object of a clang offload bundle: its magic, a count, then for each
// entry its offset, size and target triple.
absl::StatusOr<std::optional<AmdgpuKernelInfo>> FromBundle(absl::string_view image, absl::string_view entry, Bad bad) {
  uint64_t at = kBundleMagic.size();
  auto u64 = [&](uint64_t* v) {
    if (!Within(at, sizeof *v, image.size())) return false;
    *v = Read<uint64_t>(image, at);
    at += sizeof *v;
    return true;
  };
  uint64_t count = 0;
  if (!u64(&count) || count > image.size() / 24) return bad("its offload bundle's header passes its end");
  std::optional<AmdgpuKernelInfo> found;
  bool any = false;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t offset = 0, size = 0, triple_size = 0;
    if (!u64(&offset) || !u64(&size) || !u64(&triple_size) || !Within(at, triple_size, image.size()) ||
        !Within(offset, size, image.size()))
      return bad("its offload bundle's entries pass its end");
    const absl::string_view triple = image.substr(at, triple_size);
    at += triple_size;
    if (size == 0 || !absl::StrContains(triple, "amdgcn")) continue;  // the host's entry is empty
    any = true;
    auto in_entry = [&](absl::string_view what) { return bad(absl::StrCat("its bundled ", triple, ": ", what)); };
    absl::StatusOr<std::optional<AmdgpuKernelInfo>> info = FromCodeObject(image.substr(offset, size), entry, in_entry);
    if (!info.ok()) return info.status();
    if (!*info) continue;
    if (!found) {
      found = std::move(*info);
      continue;
    }
    if ((*info)->arg_sizes != found->arg_sizes || (*info)->arg_kinds != found->arg_kinds)
      return bad(absl::StrCat("its code objects disagree on kernel ", entry, "'s arguments"));
    found->kernarg_segment_size = std::max(found->kernarg_segment_size, (*info)->kernarg_segment_size);
    found->kernarg_segment_align = std::max(found->kernarg_segment_align, (*info)->kernarg_segment_align);
    uint64_t& bound = found->max_flat_workgroup_size;
    if ((*info)->max_flat_workgroup_size != 0)
      bound = bound == 0 ? (*info)->max_flat_workgroup_size : std::min(bound, (*info)->max_flat_workgroup_size);
  }
  if (!any) return bad("its offload bundle holds no AMDGPU code object");
  return found;
}

}  // namespace

absl::StatusOr<AmdgpuKernelInfo> ReadAmdgpuKernelInfo(absl::string_view image, absl::string_view entry,
                                                      absl::string_view format) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(format, " program: ", what));
  };
  absl::StatusOr<std::optional<AmdgpuKernelInfo>> info =
      absl::StartsWith(image, kBundleMagic) ? FromBundle(image, entry, bad) : FromCodeObject(image, entry, bad);
  if (!info.ok()) return info.status();
  if (!*info) return absl::InvalidArgumentError(absl::StrCat(format, " program has no kernel named ", entry));
  return std::move(**info);
}

}  // namespace replayd
