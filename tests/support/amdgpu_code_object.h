// AMDGPU code objects made by hand, for tests on a machine without ROCm's compiler: an
// ELF64 image for EM_AMDGPU reduced to what a loader and replayd read of one (the
// target in e_flags, each kernel's symbol and kernel descriptor "name.kd" in the string
// table, and the NT_AMDGPU_METADATA note, a MessagePack map laid out as LLVM writes it),
// and clang offload bundles of them.
#ifndef REPLAYD_TESTS_SUPPORT_AMDGPU_CODE_OBJECT_H_
#define REPLAYD_TESTS_SUPPORT_AMDGPU_CODE_OBJECT_H_

#include <elf.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace replayd::testing {

constexpr uint32_t kGfx90a = 0x3f, kGfx1030 = 0x36;  // EF_AMDGPU_MACH_AMDGCN_*
// EF_AMDGPU_FEATURE_*_V4: a code object's XNACK and SRAMECC settings.
constexpr uint32_t kXnackAny = 0x100, kXnackOff = 0x200, kXnackOn = 0x300, kSrameccAny = 0x400;

// A kernel as its metadata describes it.
struct AmdgpuKernelSpec {
  std::string name;
  std::vector<uint64_t> arg_sizes;  // the explicit arguments; hidden ones follow them
  uint64_t max_flat_workgroup_size = 1024;
};

// MessagePack, written in the smallest form of each value, as LLVM writes it.
class MsgPackWriter {
 public:
  MsgPackWriter& Map(uint32_t n) { return Header(0x80, 0xde, n); }
  MsgPackWriter& Array(uint32_t n) { return Header(0x90, 0xdc, n); }
  MsgPackWriter& Str(const std::string& s) {
    if (s.size() < 32) {
      out_ += static_cast<char>(0xa0 | s.size());
    } else {
      out_ += static_cast<char>(0xd9);
      out_ += static_cast<char>(s.size());
    }
    out_ += s;
    return *this;
  }
  MsgPackWriter& Uint(uint64_t v) {
    if (v < 128) {
      out_ += static_cast<char>(v);
    } else if (v < 65536) {
      out_ += static_cast<char>(0xcd);
      BigEndian(v, 2);
    } else {
      out_ += static_cast<char>(0xcf);
      BigEndian(v, 8);
    }
    return *this;
  }
  MsgPackWriter& Bool(bool b) {
    out_ += static_cast<char>(b ? 0xc3 : 0xc2);
    return *this;
  }
  const std::string& bytes() const { return out_; }

 private:
  MsgPackWriter& Header(uint8_t fix, uint8_t wide, uint32_t n) {
    if (n < 16) {
      out_ += static_cast<char>(fix | n);
    } else {
      out_ += static_cast<char>(wide);
      BigEndian(n, 2);
    }
    return *this;
  }
  void BigEndian(uint64_t v, int bytes) {
    for (int i = bytes - 1; i >= 0; --i) out_ += static_cast<char>(v >> (8 * i));
  }
  std::string out_;
};

// The metadata LLVM writes for `kernels` (in the keys' order it uses, with the hidden
// arguments HIP kernels get and fields replayd does not read).
inline std::string AmdgpuMetadata(const std::vector<AmdgpuKernelSpec>& kernels) {
  MsgPackWriter w;
  w.Map(3).Str("amdhsa.kernels").Array(static_cast<uint32_t>(kernels.size()));
  for (const AmdgpuKernelSpec& k : kernels) {
    w.Map(9).Str(".args").Array(static_cast<uint32_t>(k.arg_sizes.size() + 2));
    uint64_t offset = 0;
    for (uint64_t size : k.arg_sizes) {
      if (size) offset = (offset + size - 1) / size * size;
      w.Map(4).Str(".address_space").Str("global").Str(".offset").Uint(offset).Str(".size").Uint(size);
      w.Str(".value_kind").Str(size == 8 ? "global_buffer" : "by_value");
      offset += size;
    }
    offset = (offset + 7) / 8 * 8;
    for (auto [hidden, size] : {std::pair{"hidden_block_count_x", 4}, {"hidden_global_offset_x", 8}}) {
      w.Map(3).Str(".offset").Uint(offset).Str(".size").Uint(size).Str(".value_kind").Str(hidden);
      offset += 8;
    }
    w.Str(".kernarg_segment_align").Uint(8);
    w.Str(".kernarg_segment_size").Uint(offset);
    w.Str(".language_version").Array(2).Uint(2).Uint(0);
    w.Str(".max_flat_workgroup_size").Uint(k.max_flat_workgroup_size);
    w.Str(".name").Str(k.name);
    w.Str(".symbol").Str(k.name + ".kd");
    w.Str(".uses_dynamic_stack").Bool(false);
    w.Str(".wavefront_size").Uint(64);
  }
  w.Str("amdhsa.target").Str("amdgcn-amd-amdhsa--gfx90a");
  w.Str("amdhsa.version").Array(2).Uint(1).Uint(2);
  return w.bytes();
}

// Where a code object carries its metadata note: in a .note section, a PT_NOTE segment,
// both (one note that both name, as LLVM lays it out), or neither; `section` and
// `segment` are the note's metadata in each, nullopt for none. Two that differ are two
// notes.
struct AmdgpuNotes {
  std::optional<std::string> section, segment;
};

// A code object for the target `mach` (code object version 4, with the XNACK and SRAMECC
// settings `features`, "any" for both unless given) with `kernels`, whose metadata note
// describes them unless `notes` says otherwise.
inline std::string AmdgpuCodeObject(const std::vector<AmdgpuKernelSpec>& kernels, uint32_t mach = kGfx90a,
                                    std::optional<AmdgpuNotes> notes = std::nullopt,
                                    uint32_t features = kXnackAny | kSrameccAny) {
  if (!notes) notes = AmdgpuNotes{AmdgpuMetadata(kernels), AmdgpuMetadata(kernels)};
  auto note = [](const std::string& desc) {
    Elf64_Nhdr nh{7, static_cast<Elf64_Word>(desc.size()), 32};  // "AMDGPU", NT_AMDGPU_METADATA
    std::string n(reinterpret_cast<const char*>(&nh), sizeof nh);
    n += std::string("AMDGPU\0\0", 8) + desc;
    n.resize((n.size() + 3) / 4 * 4, '\0');
    return n;
  };
  const bool shared = notes->section && notes->segment && *notes->section == *notes->segment;
  const std::string section_note = notes->section ? note(*notes->section) : "";
  const std::string segment_note = notes->segment && !shared ? note(*notes->segment) : "";
  std::string strtab(1, '\0');
  for (const AmdgpuKernelSpec& k : kernels) strtab += k.name + '\0' + k.name + ".kd" + '\0';
  const std::string shstrtab("\0.strtab\0.shstrtab\0.note\0", 25);
  const uint64_t phnum = notes->segment ? 1 : 0;
  const uint64_t section_at = sizeof(Elf64_Ehdr) + phnum * sizeof(Elf64_Phdr);
  const uint64_t segment_at = section_at + section_note.size();
  const uint64_t strtab_at = segment_at + segment_note.size();
  const uint64_t shoff = (strtab_at + strtab.size() + shstrtab.size() + 7) / 8 * 8;

  Elf64_Ehdr h;
  std::memset(&h, 0, sizeof h);
  std::memcpy(h.e_ident, ELFMAG, SELFMAG);
  h.e_ident[EI_CLASS] = ELFCLASS64;
  h.e_ident[EI_DATA] = ELFDATA2LSB;
  h.e_ident[EI_VERSION] = EV_CURRENT;
  h.e_ident[EI_OSABI] = 64;      // ELFOSABI_AMDGPU_HSA
  h.e_ident[EI_ABIVERSION] = 2;  // code object version 4
  h.e_type = ET_DYN;
  h.e_machine = EM_AMDGPU;
  h.e_version = EV_CURRENT;
  h.e_flags = mach | features;
  h.e_ehsize = sizeof h;
  h.e_phentsize = sizeof(Elf64_Phdr);
  h.e_phnum = static_cast<uint16_t>(phnum);
  h.e_phoff = phnum ? sizeof h : 0;
  h.e_shentsize = sizeof(Elf64_Shdr);
  h.e_shnum = notes->section ? 4 : 3;
  h.e_shstrndx = 2;
  h.e_shoff = shoff;
  Elf64_Phdr ph;
  std::memset(&ph, 0, sizeof ph);
  ph.p_type = PT_NOTE;
  ph.p_offset = shared ? section_at : segment_at;
  ph.p_filesz = ph.p_memsz = shared ? section_note.size() : segment_note.size();
  ph.p_align = 4;
  Elf64_Shdr sections[4];
  std::memset(sections, 0, sizeof sections);
  sections[1].sh_name = 1;
  sections[1].sh_type = SHT_STRTAB;
  sections[1].sh_offset = strtab_at;
  sections[1].sh_size = strtab.size();
  sections[2].sh_name = 9;
  sections[2].sh_type = SHT_STRTAB;
  sections[2].sh_offset = strtab_at + strtab.size();
  sections[2].sh_size = shstrtab.size();
  sections[3].sh_name = 19;
  sections[3].sh_type = SHT_NOTE;
  sections[3].sh_offset = section_at;
  sections[3].sh_size = section_note.size();
  sections[3].sh_addralign = 4;

  std::string image(reinterpret_cast<const char*>(&h), sizeof h);
  if (phnum) image.append(reinterpret_cast<const char*>(&ph), sizeof ph);
  image += section_note + segment_note + strtab + shstrtab;
  image.resize(shoff, '\0');
  image.append(reinterpret_cast<const char*>(sections), h.e_shnum * sizeof(Elf64_Shdr));
  return image;
}

// A clang offload bundle, as some hiprtc versions return hip-c's code: the magic, the
// entry count, each entry's offset, size and triple, then the entries' bytes.
inline std::string OffloadBundle(const std::vector<std::pair<std::string, std::string>>& entries) {
  std::string header = "__CLANG_OFFLOAD_BUNDLE__";
  auto u64 = [](uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); };
  size_t size = header.size() + 8;
  for (const auto& [triple, image] : entries) size += 24 + triple.size();
  header += u64(entries.size());
  std::string body;
  for (const auto& [triple, image] : entries) {
    header += u64(size + body.size()) + u64(image.size()) + u64(triple.size()) + triple;
    body += image;
  }
  return header + body;
}

}  // namespace replayd::testing

#endif  // REPLAYD_TESTS_SUPPORT_AMDGPU_CODE_OBJECT_H_
