# Writes OUT: a C++ file defining replayd::DemoKernel(name) over the C files in DIR.
separate_arguments(NAMES)
set(body "// Generated from client/kernels/*.c by embed_kernels.cmake.\n#include \"demo.h\"\n\nnamespace replayd::client {\n\nstd::string DemoKernel(const std::string& name) {\n")
foreach(n ${NAMES})
  file(READ ${DIR}/${n}.c code)
  string(APPEND body "  if (name == \"${n}\") return R\"replayd_kernel(${code})replayd_kernel\";\n")
endforeach()
string(APPEND body "  return \"\";\n}\n\n}  // namespace replayd::client\n")
file(WRITE ${OUT} "${body}")
