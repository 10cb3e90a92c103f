# Writes OUT: a C++ file defining replayd::DemoKernel(file name) over the kernel sources in DIR.
separate_arguments(NAMES)
set(body "// Generated from client/kernels/ by embed_kernels.cmake.\n#include \"demo.h\"\n\nnamespace replayd::client {\n\nstd::string DemoKernel(const std::string& name) {\n")
foreach(n ${NAMES})
  file(READ ${DIR}/${n} code)
  string(APPEND body "  if (name == \"${n}\") return R\"replayd_kernel(${code})replayd_kernel\";\n")
endforeach()
string(APPEND body "  return \"\";\n}\n\n}  // namespace replayd::client\n")
file(WRITE ${OUT} "${body}")
