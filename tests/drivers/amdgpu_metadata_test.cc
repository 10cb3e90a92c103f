// A kernel's arguments and launch bounds, read from an AMDGPU code object's metadata
// note, on code objects made by hand (tests/support/amdgpu_code_object.h); what hiprtc
// writes is read in hip/hip_program_test.cc.
#include "drivers/amdgpu_metadata.h"

#include <gmock/gmock.h>

#include "tests/support/amdgpu_code_object.h"
#include "tests/support/status_macros.h"

namespace replayd {
namespace {

using testing::AmdgpuCodeObject;
using testing::AmdgpuKernelSpec;
using testing::AmdgpuMetadata;
using testing::AmdgpuNotes;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::MsgPackWriter;
using testing::OffloadBundle;

const AmdgpuKernelSpec kScale{"scale", {8, 4}, 256}, kAdd{"add", {8, 8, 8, 4}};

// The message of `image`'s refusal for `entry`; "" (and a failure) when it is read.
std::string Refusal(const std::string& image, const std::string& entry = "scale") {
  absl::StatusOr<AmdgpuKernelInfo> info = ReadAmdgpuKernelInfo(image, entry, "hip-hsaco");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument) << info.status();
  return std::string(info.status().message());
}

TEST(AmdgpuMetadataTest, AKernelsExplicitArgumentsAndLaunchBoundsAreRead) {
  const std::string image = AmdgpuCodeObject({kScale, kAdd});
  ASSERT_OK_AND_ASSIGN(AmdgpuKernelInfo scale, ReadAmdgpuKernelInfo(image, "scale", "hip-hsaco"));
  EXPECT_THAT(scale.arg_sizes, ElementsAre(8, 4)) << "the hidden arguments after them are the runtime's";
  EXPECT_THAT(scale.arg_kinds, ElementsAre("global_buffer", "by_value"));
  EXPECT_EQ(scale.max_flat_workgroup_size, 256u);
  EXPECT_EQ(scale.kernarg_segment_size, 32u) << "12 bytes, aligned to 8, then two hidden arguments of 8";
  EXPECT_EQ(scale.kernarg_segment_align, 8u);
  ASSERT_OK_AND_ASSIGN(AmdgpuKernelInfo add, ReadAmdgpuKernelInfo(image, "add", "hip-hsaco"));
  EXPECT_THAT(add.arg_sizes, ElementsAre(8, 8, 8, 4));
  EXPECT_EQ(add.max_flat_workgroup_size, 1024u);
  EXPECT_EQ(add.kernarg_segment_size, 48u);
  ASSERT_OK_AND_ASSIGN(AmdgpuKernelInfo none, ReadAmdgpuKernelInfo(AmdgpuCodeObject({{"k", {}}}), "k", "hip-hsaco"));
  EXPECT_TRUE(none.arg_sizes.empty());
  EXPECT_EQ(Refusal(image, "missing"), "hip-hsaco program has no kernel named missing");
  EXPECT_EQ(Refusal(image, "scal"), "hip-hsaco program has no kernel named scal") << "names match whole";
}

// The note is found where a loader may look for it, in a PT_NOTE segment or a .note
// section; where both hold one, they must agree.
TEST(AmdgpuMetadataTest, TheNoteIsReadFromASegmentOrASectionAndTwoMustAgree) {
  const std::string metadata = AmdgpuMetadata({kScale});
  for (AmdgpuNotes notes :
       {AmdgpuNotes{metadata, std::nullopt}, AmdgpuNotes{std::nullopt, metadata}, AmdgpuNotes{metadata, metadata}}) {
    ASSERT_OK_AND_ASSIGN(
        AmdgpuKernelInfo info,
        ReadAmdgpuKernelInfo(AmdgpuCodeObject({kScale}, testing::kGfx90a, notes), "scale", "hip-hsaco"));
    EXPECT_THAT(info.arg_sizes, ElementsAre(8, 4));
  }
  EXPECT_THAT(Refusal(AmdgpuCodeObject({kScale}, testing::kGfx90a, AmdgpuNotes{})),
              HasSubstr("no AMDGPU metadata note (code objects of version 3 and later carry one)"));
  const AmdgpuKernelSpec shorter{"scale", {8}, 256};
  EXPECT_THAT(Refusal(AmdgpuCodeObject({kScale}, testing::kGfx90a, AmdgpuNotes{metadata, AmdgpuMetadata({shorter})})),
              HasSubstr("two AMDGPU metadata notes that differ"));
}

TEST(AmdgpuMetadataTest, AnImageThatIsNoCodeObjectIsRefused) {
  EXPECT_THAT(Refusal(""), HasSubstr("shorter than an ELF64 header"));
  EXPECT_THAT(Refusal("MZ\x90"), HasSubstr("hip-hsaco program"));
  std::string cut = AmdgpuCodeObject({kScale});
  cut.resize(cut.size() - 1);
  EXPECT_THAT(Refusal(cut), HasSubstr("pass its end"));
}

// A note whose sizes pass its section, and metadata cut short at every length, are
// refused without a read past their bytes (AddressSanitizer checks the reads).
TEST(AmdgpuMetadataTest, MetadataCutShortOrNotesPastTheirEndAreRefused) {
  const std::string metadata = AmdgpuMetadata({kScale});
  for (size_t n = 0; n < metadata.size(); ++n) {
    const std::string cut = metadata.substr(0, n);
    absl::StatusOr<AmdgpuKernelInfo> info =
        ReadAmdgpuKernelInfo(AmdgpuCodeObject({kScale}, testing::kGfx90a, AmdgpuNotes{cut, cut}), "scale", "hip-hsaco");
    EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument) << n << " of " << metadata.size() << " bytes";
  }
  std::string image = AmdgpuCodeObject({kScale}, testing::kGfx90a, AmdgpuNotes{metadata, std::nullopt});
  const size_t note_at = sizeof(Elf64_Ehdr);  // no program headers: the note section comes first
  Elf64_Nhdr nh;
  std::memcpy(&nh, image.data() + note_at, sizeof nh);
  ASSERT_EQ(nh.n_type, 32u);
  nh.n_descsz = 0xffffff00;
  std::memcpy(image.data() + note_at, &nh, sizeof nh);
  EXPECT_THAT(Refusal(image), HasSubstr("a note of it passes its end"));
}

// Well-formed MessagePack that is not metadata of the expected form: another top-level
// kind, a kernels entry that is not an array, an argument without a size, a key given
// twice (which of the two a runtime keeps is its own choice), a count larger than the
// bytes could hold, the never-used byte 0xc1; and nesting deep enough to overflow a
// recursive reader, which is skipped.
TEST(AmdgpuMetadataTest, MetadataOfAnotherFormIsRefused) {
  auto refused = [](const std::string& metadata) {
    return Refusal(AmdgpuCodeObject({kScale}, testing::kGfx90a, AmdgpuNotes{metadata, metadata}));
  };
  EXPECT_THAT(refused(MsgPackWriter().Array(0).bytes()), HasSubstr("not a MessagePack map"));
  EXPECT_THAT(refused(MsgPackWriter().Map(1).Str("amdhsa.kernels").Uint(3).bytes()), HasSubstr("malformed"));
  MsgPackWriter no_size;
  no_size.Map(1).Str("amdhsa.kernels").Array(1).Map(2).Str(".symbol").Str("scale.kd").Str(".args").Array(1);
  no_size.Map(1).Str(".value_kind").Str("by_value");
  EXPECT_THAT(refused(no_size.bytes()), HasSubstr("malformed"));
  MsgPackWriter twice;
  twice.Map(1).Str("amdhsa.kernels").Array(1).Map(3).Str(".symbol").Str("scale.kd");
  twice.Str(".max_flat_workgroup_size").Uint(64).Str(".max_flat_workgroup_size").Uint(1024);
  EXPECT_THAT(refused(twice.bytes()), HasSubstr("malformed"));
  MsgPackWriter described_twice;
  described_twice.Map(1).Str("amdhsa.kernels").Array(2);
  for (int i = 0; i < 2; ++i) described_twice.Map(1).Str(".symbol").Str("scale.kd");
  EXPECT_THAT(refused(described_twice.bytes()), HasSubstr("describes kernel scale twice"));
  EXPECT_THAT(refused(std::string("\xdf\xff\xff\xff\xff", 5)), HasSubstr("malformed")) << "2^32 - 1 keys";
  EXPECT_THAT(refused(std::string("\x81\xa1x\xc1", 4)), HasSubstr("malformed"));

  std::string deep = MsgPackWriter().Map(2).Str("deep").bytes();
  deep += std::string(200000, '\x91') + '\xc0';  // arrays of one array of one ... of nil
  deep += MsgPackWriter().Str("amdhsa.kernels").Array(1).Map(1).Str(".symbol").Str("scale.kd").bytes();
  ASSERT_OK_AND_ASSIGN(AmdgpuKernelInfo info,
                       ReadAmdgpuKernelInfo(AmdgpuCodeObject({kScale}, testing::kGfx90a, AmdgpuNotes{deep, deep}),
                                            "scale", "hip-hsaco"));
  EXPECT_TRUE(info.arg_sizes.empty());
  EXPECT_EQ(info.max_flat_workgroup_size, 0u) << "not given";
  EXPECT_EQ(info.kernarg_segment_size, 0u) << "not given";
}

// In an offload bundle every code object that describes the kernel must agree on its
// arguments; the smallest launch bounds count; the host's empty entry is passed over.
TEST(AmdgpuMetadataTest, AnOffloadBundlesCodeObjectsAreReadAndMustAgree) {
  const AmdgpuKernelSpec narrow{"scale", {8, 4}, 128};
  const std::string bundle =
      OffloadBundle({{"host-x86_64-unknown-linux", ""},
                     {"hipv4-amdgcn-amd-amdhsa--gfx1030", AmdgpuCodeObject({kScale}, testing::kGfx1030)},
                     {"hipv4-amdgcn-amd-amdhsa--gfx90a", AmdgpuCodeObject({narrow, kAdd})}});
  ASSERT_OK_AND_ASSIGN(AmdgpuKernelInfo scale, ReadAmdgpuKernelInfo(bundle, "scale", "hip-c"));
  EXPECT_THAT(scale.arg_sizes, ElementsAre(8, 4));
  EXPECT_EQ(scale.max_flat_workgroup_size, 128u);
  EXPECT_EQ(scale.kernarg_segment_size, 32u);
  ASSERT_OK_AND_ASSIGN(AmdgpuKernelInfo add, ReadAmdgpuKernelInfo(bundle, "add", "hip-c"));
  EXPECT_THAT(add.arg_sizes, ElementsAre(8, 8, 8, 4)) << "described by one of the two";

  const AmdgpuKernelSpec other{"scale", {8, 8}};
  EXPECT_THAT(Refusal(OffloadBundle({{"hipv4-amdgcn-amd-amdhsa--gfx1030", AmdgpuCodeObject({kScale})},
                                     {"hipv4-amdgcn-amd-amdhsa--gfx90a", AmdgpuCodeObject({other})}})),
              HasSubstr("disagree on kernel scale's arguments"));
  EXPECT_THAT(Refusal(OffloadBundle({{"host-x86_64-unknown-linux", ""}})), HasSubstr("holds no AMDGPU code object"));
  EXPECT_THAT(Refusal(OffloadBundle({{"hipv4-amdgcn-amd-amdhsa--gfx90a", "MZ"}})),
              HasSubstr("its bundled hipv4-amdgcn-amd-amdhsa--gfx90a: "));
  for (size_t n : {size_t{24}, size_t{30}, bundle.size() / 2}) {
    SCOPED_TRACE(n);
    Refusal(bundle.substr(0, n));
  }
}

}  // namespace
}  // namespace replayd
