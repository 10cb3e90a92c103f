// The test hooks of the fake HIP runtime (fake_hip.cc, built as libamdhip64.so.6): a host
// stand-in for AMD's libamdhip64 that serves one device, hip:0 "Fake MI210"
// (gfx90a:sramecc+:xnack-, or xnack+ where HSA_XNACK=1, as ROCr sets the XNACK mode),
// with host memory as device memory, and is as strict as the
// runtime where replayd depends on it, so that misuse fails on a machine without a GPU.
//
// Nothing links the library: a test opens it as the daemon does, with
// dlopen("libamdhip64.so.6") on an LD_LIBRARY_PATH that leads to the fake (a name
// HipLibrary tries before the libamdhip64.so.5 Debian installs; a copy named
// libamdhip64.so.7, ROCm 7's name, lies in the build's rocm7/ folder beside it), and finds
// these hooks with dlsym. Their presence is what tells the fake from the real runtime.
//
// What the fake does, besides answering every entry point HipLibrary resolves, with the
// prototypes of the HIP headers it is built with (and their version, HIP_VERSION):
// - device memory is host memory; a copy, memset or memcpy node whose device range is
//   not inside a live allocation is hipErrorInvalidValue, and address 0 never is;
// - streams, events and modules belong to the device current when they were made
//   (hipSetDevice), and are refused on another;
// - hipModuleLoadData takes what replayd's HIP programs are: an AMDGPU code object (an
//   ELF64 image for EM_AMDGPU whose target is gfx90a with compatible sramecc and xnack
//   settings), or a clang offload bundle holding one for that target; another target is
//   hipErrorNoBinaryForGpu, anything else hipErrorInvalidImage. hipModuleGetFunction
//   finds a kernel by its name when the image has its kernel descriptor ("name.kd");
// - work runs when it is waited for, as on a GPU some time after the call that submitted
//   it: copies, memsets, kernel launches and graph launches queue on their stream and
//   run, in submission order, at a synchronize of that stream (of the null stream: of
//   every stream), at a synchronize of an event recorded after them, or when the stream
//   ends; hipFree, hipHostFree and hipHostUnregister wait for all work first, and
//   hipDeviceReset drops it. Pageable host memory is taken at the call (a copy to the
//   device reads it then; one from the device runs the stream's work and copies before
//   it returns); page-locked memory (registered or hipHostMalloc's) is read or written in
//   the copy's turn. So a missing wait shows as stale bytes, and a staging buffer reused
//   too early as the wrong ones;
// - kernels do not run: a kernel launch or kernel node, in its turn, whose function is
//   named "fault", whose module has been unloaded since, or one of whose pointer
//   arguments (".value_kind" global_buffer in the code object's metadata) lies outside
//   the live allocations then, makes the sticky fault instead,
//   as does a graph whose memcpy node reaches memory freed since it was set. From then on
//   every call that uses the device returns hipErrorIllegalAddress (what ROCm reports for
//   a kernel's memory fault, where it does not abort the process); releases still release
//   and queued work is dropped. hipDeviceReset frees everything of the device and clears
//   the fault;
// - graph launches perform their memcpy nodes in an order a GPU might take (of the nodes
//   whose dependencies have run, the one created last: tests/support/graph_order.h, so a
//   missing edge between two copies shows), with the nodes as they were at the launch; hipGraphExecKernelNodeSetParams and hipGraphExecMemcpyNodeSetParams1D
//   retarget an instantiated node (for later launches), checked as a new node is;
// - an instantiated graph holds an argument segment for each kernel node (the kernel's
//   metadata's .kernarg_segment_size, aligned as ROCm aligns it: to at least 128 bytes)
//   and each memcpy node (512 bytes: the blit kernel's), and takes one more at each
//   hipGraphExecKernelNodeSetParams and hipGraphExecMemcpyNodeSetParams1D, all given back
//   only when it is destroyed, as ROCm's graph kernarg pool does (rocm-systems#10713): past
//   fake_hip_set_kernarg_limit, instantiation and update are hipErrorOutOfMemory.
//
// hiprtc: the fake exports hiprtc's entry points, so HipLibrary finds them inside the
// runtime (as on ROCm 5) and never pairs the fake with a real libhiprtc. They compile
// nothing: hiprtcCompileProgram fails with HIPRTC_ERROR_COMPILATION and a log, in comgr's
// form, saying so. A hip-c program is refused at its load with that log; tests load
// hip-hsaco code objects.
//
// Thread safety: the library is thread-safe (one lock). The hooks are for use between
// tests, with no daemon running on the library.
#ifndef REPLAYD_TESTS_SUPPORT_FAKE_HIP_FAKE_HIP_H_
#define REPLAYD_TESTS_SUPPORT_FAKE_HIP_FAKE_HIP_H_

#ifdef __cplusplus
extern "C" {
#endif

// Forgets everything: frees every allocation, destroys every object, clears the sticky
// fault, undoes hipInit and makes device 0 current on the calling thread. Handles held
// from before are stale from then on.
void fake_hip_reset(void);

// How many of `what` there are: live "allocations" (hipMalloc), "host_allocations"
// (hipHostMalloc), "registered" (host ranges hipHostRegister holds), "registered_copies"
// (host <-> device copies from or into registered memory, since the reset), "streams",
// "events", "modules", "graphs", "graph_execs"; "instantiations" of graphs since the
// reset; "kernarg_bytes": the argument segments live graph execs hold;
// "reclaimed": objects hipDeviceReset freed because nobody had before it; "resets":
// calls of hipDeviceReset; "faulted": 1 after the sticky fault, else 0. -1 for any other
// word.
int fake_hip_count(const char* what);

// The most bytes of argument segments all graph execs together may hold (until the next
// reset; none after the reset): past it, hipGraphInstantiateWithFlags and
// hipGraphExecKernelNodeSetParams fail with hipErrorOutOfMemory. ROCm's pool grows into
// device memory until an allocation fails, and then (ROCm 7.2) writes through a null
// pointer (rocm-systems#10021).
void fake_hip_set_kernarg_limit(unsigned long long bytes);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // REPLAYD_TESTS_SUPPORT_FAKE_HIP_FAKE_HIP_H_
