// The test hooks of the fake CUDA driver library (fake_cuda.cc, built as libcuda.so.1):
// a host stand-in for NVIDIA's libcuda that serves one device, "Fake H200", with host
// memory as device memory, and is as strict as the real driver where replayd depends on
// it, so that misuse fails on a machine without a GPU.
//
// Nothing links the library: a test opens it as the daemon does, with
// dlopen("libcuda.so.1") on an LD_LIBRARY_PATH that leads to the fake, and finds these
// hooks with dlsym. Their presence is what tells the fake from the real driver.
//
// What the fake does, besides answering every entry point CudaLibrary resolves:
// - each thread has a context stack; cuCtxCreate pushes the context it creates, as the
//   real driver does;
// - device memory is host memory; a copy, memset or memcpy node whose device range is
//   not inside a live allocation is CUDA_ERROR_INVALID_VALUE (for a memcpy node, an
//   allocation of the node's context), and address 0 never is; a memcpy node (1D or 2D)
//   whose pitch is short of its width or past the device's maximum pitch is
//   CUDA_ERROR_INVALID_VALUE;
// - work runs when it is waited for, as on a GPU some time after the call that submitted
//   it: copies, memsets, kernel launches and graph launches queue on their stream (the
//   default stream's queue is the context's) and run, in submission order, at a
//   synchronize of that stream (of the default stream: of every queue holding the
//   context's work), at a synchronize of an event recorded after them, or when the
//   stream or context ends; cuMemFree, cuMemFreeHost and cuMemHostUnregister wait for all
//   work first, as the driver does. Pageable host memory is taken at the call (a copy to
//   the device reads it then; one from the device runs the stream's work and copies
//   before it returns); page-locked memory (registered or cuMemHostAlloc's) is read or
//   written in the copy's turn. So a missing wait shows as stale bytes, and a staging
//   buffer reused too early as the wrong ones;
// - kernels do not run: a kernel launch or kernel node, in its turn, whose function is
//   named "fault" or whose module has been unloaded since, makes the sticky fault
//   instead, as does a graph whose memcpy node reaches memory freed since it was set.
//   From then on every call of the library that involves a context, new contexts
//   included, returns CUDA_ERROR_ILLEGAL_ADDRESS (or the error fake_cuda_set_fault_error
//   names), as an H200 did after a kernel's illegal access; releases still release, and
//   queued work is dropped.
// - a kernel's parameters and launch bounds are read from its image (a PTX .entry's list
//   and .maxntid or .reqntid, a cubin's .nv.info section) and answered by
//   cuFuncGetParamInfo and cuFuncGetAttribute (MAX_THREADS_PER_BLOCK); a launch, kernel
//   node or node update reads one argument pointer per parameter and each parameter's
//   bytes through it, as the driver does, refuses missing ones, and refuses a block past
//   the launch bounds;
// - graph launches perform their memcpy nodes in an order a GPU might take (of the nodes
//   whose dependencies have run, the one created last: tests/support/graph_order.h, so a
//   missing edge between two copies shows), with the nodes as they were at the launch (an
//   update afterwards changes later launches only);
//   cuGraphExecMemcpyNodeSetParams takes what its documentation allows: new 1-dimensional
//   operands of any size in the node's context, and only while the operands the node was
//   instantiated with are still allocated ("the memory operands' mappings changed" is
//   CUDA_ERROR_INVALID_VALUE), and only for a node instantiated 1-dimensional.
// - cuMemHostRegister refuses a range that overlaps one registered (or cuMemHostAlloc's
//   memory), cuMemHostUnregister one it does not hold, and a context's end drops its
//   registrations (counted as reclaimed).
//
// Thread safety: the library is thread-safe (one lock). The hooks are for use between
// tests, with no daemon running on the library.
#ifndef REPLAYD_TESTS_SUPPORT_FAKE_CUDA_FAKE_CUDA_H_
#define REPLAYD_TESTS_SUPPORT_FAKE_CUDA_FAKE_CUDA_H_

#ifdef __cplusplus
extern "C" {
#endif

// Forgets everything: frees every allocation, destroys every object, clears the sticky
// fault, empties the calling thread's context stack and undoes cuInit. Handles held from
// before are stale from then on.
void fake_cuda_reset(void);

// Makes the device's CU_DEVICE_ATTRIBUTE_MAX_PITCH `pitch` (an H200's, 2 GiB - 1, when it
// is not positive) until the next reset: a memcpy node whose pitch passes it is refused,
// so that copies larger than the pitch can be tested in the fake's 1 GiB. Read by the
// daemon's devices when they are discovered.
void fake_cuda_set_max_pitch(int pitch);

// Makes the driver's CUDA version `version` (cuDriverGetVersion; 13000 for 13.0) until the
// next reset: cuGetProcAddress refuses a newer version with CUDA_ERROR_INVALID_VALUE, as
// the driver documents.
void fake_cuda_set_driver_version(int version);

// Makes the sticky fault answer `error` (a CUresult; CUDA_ERROR_ILLEGAL_ADDRESS unless set)
// until the next reset, for each error the driver documents as leaving the process in an
// inconsistent state.
void fake_cuda_set_fault_error(int error);

// Makes the device's compute mode `mode` (a CUcomputemode: CU_DEVICE_ATTRIBUTE_COMPUTE_MODE)
// until the next reset, and says whether another process holds the device. As the driver
// documents, a new context (cuCtxCreate, or retaining a primary context not yet active)
// is CUDA_ERROR_UNKNOWN in prohibited mode, and CUDA_ERROR_DEVICE_UNAVAILABLE in
// exclusive-process mode while another process holds the device.
void fake_cuda_set_compute_mode(int mode, int held_elsewhere);

// The depth of the calling thread's context stack.
int fake_cuda_context_stack_depth(void);

// How many of `what` there are: live "contexts" (the primary context counts while
// retained), "allocations" (cuMemAlloc), "host_allocations" (cuMemHostAlloc),
// "registered" (host ranges cuMemHostRegister holds), "registered_copies" (host <-> device
// copies from or into registered memory, since the reset), "streams",
// "events", "modules", "graphs", "graph_execs"; "reclaimed": objects a context's
// destruction freed because nobody had before it; "faulted": 1 after the sticky fault,
// else 0. -1 for any other word.
int fake_cuda_count(const char* what);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // REPLAYD_TESTS_SUPPORT_FAKE_CUDA_FAKE_CUDA_H_
