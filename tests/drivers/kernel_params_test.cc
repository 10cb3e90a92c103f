#include "drivers/kernel_params.h"

#include <gtest/gtest.h>

#include <cstring>

namespace replayd {
namespace {

Signature Sig(std::initializer_list<ParamKind> kinds) {
  Signature s;
  for (ParamKind k : kinds) s.params.push_back({"", k, k == ParamKind::kBuffer ? Access::kInout : Access::kNone});
  return s;
}

TEST(KernelParamsTest, EachArgumentAtItsNaturalAlignment) {
  KernelParams p(Sig({ParamKind::kBuffer, ParamKind::kInt32, ParamKind::kInt64, ParamKind::kInt32, ParamKind::kInt32,
                      ParamKind::kBuffer}));
  EXPECT_EQ(p.offset(0), 0u);
  EXPECT_EQ(p.offset(1), 8u);
  EXPECT_EQ(p.offset(2), 16u);  // int64 after an int32: padded to 8
  EXPECT_EQ(p.offset(3), 24u);
  EXPECT_EQ(p.offset(4), 28u);  // two int32 pack together
  EXPECT_EQ(p.offset(5), 32u);
  EXPECT_EQ(p.size(), 40u);
}

TEST(KernelParamsTest, PackWritesValuesWhereThePointersPoint) {
  KernelParams p(Sig({ParamKind::kBuffer, ParamKind::kInt32, ParamKind::kInt64}));
  ArgValue args[3];
  args[0].address = 0x7f0000001000 + 64;  // a view's offset is already applied
  args[1].integer = -7;
  args[2].integer = int64_t{1} << 40;
  p.Pack(args);
  uint64_t address;
  int32_t i32;
  int64_t i64;
  std::memcpy(&address, p.pointers()[0], 8);
  std::memcpy(&i32, p.pointers()[1], 4);
  std::memcpy(&i64, p.pointers()[2], 8);
  EXPECT_EQ(address, 0x7f0000001040u);
  EXPECT_EQ(i32, -7);
  EXPECT_EQ(i64, int64_t{1} << 40);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(static_cast<uint8_t*>(p.pointers()[i]), p.block().data() + p.offset(i));
  // Repacking patches in place: the pointers stay valid for a device graph node.
  args[1].integer = 5;
  void* before = p.pointers()[1];
  EXPECT_TRUE(p.Pack(args));
  EXPECT_EQ(p.pointers()[1], before);
  std::memcpy(&i32, p.pointers()[1], 4);
  EXPECT_EQ(i32, 5);
}

TEST(KernelParamsTest, PackSaysWhetherAnyValueChanged) {
  KernelParams p(Sig({ParamKind::kBuffer, ParamKind::kInt32}));
  ArgValue args[2];
  args[0].address = 0x1000;
  args[1].integer = 3;
  EXPECT_TRUE(p.Pack(args));
  EXPECT_FALSE(p.Pack(args));                // the same values: nothing to patch
  args[1].integer = 3 + (int64_t{1} << 32);  // the same int32 once truncated
  EXPECT_FALSE(p.Pack(args));
  args[0].address = 0x2000;
  EXPECT_TRUE(p.Pack(args));
}

TEST(KernelParamsTest, LayoutReusesOneBlockForAnotherSignature) {
  KernelParams p;
  EXPECT_EQ(p.size(), 0u);
  p.Layout(Sig({ParamKind::kBuffer, ParamKind::kInt64, ParamKind::kInt64}));
  ArgValue wide[3];
  wide[0].address = 0x1000;
  wide[1].integer = -1;
  wide[2].integer = -1;
  p.Pack(wide);
  // A smaller signature afterwards: fresh offsets, a zeroed block, pointers into it.
  p.Layout(Sig({ParamKind::kInt32, ParamKind::kBuffer}));
  EXPECT_EQ(p.size(), 16u);
  EXPECT_EQ(p.offset(1), 8u);
  for (uint8_t b : p.block()) EXPECT_EQ(b, 0);
  ArgValue narrow[2];
  narrow[0].integer = 9;
  narrow[1].address = 0x2000;
  EXPECT_TRUE(p.Pack(narrow));
  int32_t i32;
  uint64_t address;
  std::memcpy(&i32, p.pointers()[0], 4);
  std::memcpy(&address, p.pointers()[1], 8);
  EXPECT_EQ(i32, 9);
  EXPECT_EQ(address, 0x2000u);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(static_cast<uint8_t*>(p.pointers()[i]), p.block().data() + p.offset(i));
}

TEST(KernelParamsTest, EmptySignature) {
  KernelParams p(Signature{});
  EXPECT_EQ(p.size(), 0u);
  p.Pack({});
}

}  // namespace
}  // namespace replayd
