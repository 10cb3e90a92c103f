#include "drivers/elf_image.h"

#include <elf.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace replayd {
namespace {

// True when [offset, offset + count * size) lies inside `limit` bytes, without overflow.
bool Inside(uint64_t offset, uint64_t count, uint64_t size, uint64_t limit) {
  if (offset > limit) return false;
  if (size != 0 && count > (limit - offset) / size) return false;
  return true;
}

}  // namespace

absl::Status CheckElfImage(absl::string_view image, uint16_t machine, absl::string_view format) {
  auto bad = [&](auto&&... what) {
    return absl::InvalidArgumentError(absl::StrCat(format, " image of ", image.size(), " bytes: ", what...));
  };
  Elf64_Ehdr eh;
  if (image.size() < sizeof eh) return bad("shorter than an ELF64 header");
  std::memcpy(&eh, image.data(), sizeof eh);
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) return bad("not an ELF image");
  if (eh.e_ident[EI_CLASS] != ELFCLASS64) return bad("not ELF64");
  if (eh.e_ident[EI_DATA] != ELFDATA2LSB) return bad("not little-endian");
  if (eh.e_ident[EI_VERSION] != EV_CURRENT || eh.e_version != EV_CURRENT) return bad("unknown ELF version");
  if (eh.e_machine != machine) return bad("machine ", eh.e_machine, ", not ", machine);
  if (eh.e_ehsize != sizeof(Elf64_Ehdr)) return bad("header size ", eh.e_ehsize);
  const uint64_t size = image.size();
  if (eh.e_phnum > 0) {
    if (eh.e_phentsize != sizeof(Elf64_Phdr)) return bad("program header size ", eh.e_phentsize);
    if (!Inside(eh.e_phoff, eh.e_phnum, sizeof(Elf64_Phdr), size))
      return bad(eh.e_phnum, " program headers at ", eh.e_phoff, " pass its end");
    for (uint16_t i = 0; i < eh.e_phnum; ++i) {
      Elf64_Phdr ph;
      std::memcpy(&ph, image.data() + eh.e_phoff + uint64_t{i} * sizeof ph, sizeof ph);
      if (!Inside(ph.p_offset, 1, ph.p_filesz, size))
        return bad("segment ", i, " (", ph.p_filesz, " bytes at ", ph.p_offset, ") passes its end");
    }
  }
  if (eh.e_shnum == 0) return eh.e_shoff == 0 ? absl::OkStatus() : bad("section headers but no count");
  if (eh.e_shentsize != sizeof(Elf64_Shdr)) return bad("section header size ", eh.e_shentsize);
  if (!Inside(eh.e_shoff, eh.e_shnum, sizeof(Elf64_Shdr), size))
    return bad(eh.e_shnum, " section headers at ", eh.e_shoff, " pass its end");
  if (eh.e_shstrndx >= eh.e_shnum) return bad("section-name table ", eh.e_shstrndx, " of ", eh.e_shnum);
  for (uint16_t i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, image.data() + eh.e_shoff + uint64_t{i} * sizeof sh, sizeof sh);
    if (sh.sh_type != SHT_NOBITS && !Inside(sh.sh_offset, 1, sh.sh_size, size))
      return bad("section ", i, " (", sh.sh_size, " bytes at ", sh.sh_offset, ") passes its end");
    if (sh.sh_entsize != 0 && sh.sh_size % sh.sh_entsize != 0 && sh.sh_type != SHT_NOBITS)
      return bad("section ", i, " is not a whole number of ", sh.sh_entsize, "-byte entries");
  }
  return absl::OkStatus();
}

}  // namespace replayd
