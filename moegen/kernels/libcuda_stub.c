/* A stand-in libcuda.so.1 for machines without an NVIDIA driver.
 *
 * Transformer Engine's libraries (libnccl_ep.so) and cuDNN's runtime-compiled engines name
 * libcuda.so.1 as a dependency, so `import transformer_engine.jax` fails where no driver is
 * installed. Loaded RTLD_GLOBAL first (moegen.kernels.te.prepare_te), this library satisfies
 * the loader; every driver call fails with CUDA_ERROR_STUB_LIBRARY, so nothing can run on a GPU,
 * which is all that tracing and lowering for CUDA need.
 *
 * Built by scripts/install-te:
 *   gcc -shared -fPIC -O2 -Wl,-soname,libcuda.so.1 -o VENV/lib/moegen-te/libcuda.so.1 this.c
 * The symbol list is what `nm -D --undefined-only` shows for libnccl_ep.so (TE 2.20.2) and
 * libcudnn_engines_runtime_compiled.so.9 (cuDNN 9.28), plus the entry points the CUDA runtime
 * looks up first.
 */

typedef int CUresult;
enum { CUDA_ERROR_STUB_LIBRARY = 34 };

static const char stub_message[] = "stub libcuda.so.1 (moegen): no NVIDIA driver on this machine";

CUresult cuGetErrorString(CUresult error, const char **text) {
  (void)error;
  if (text) *text = stub_message;
  return 0;
}

CUresult cuGetErrorName(CUresult error, const char **text) {
  (void)error;
  if (text) *text = "CUDA_ERROR_STUB_LIBRARY";
  return 0;
}

/* Every other entry point: any arguments, always the stub error. */
#define STUB(name) \
  CUresult name() { return CUDA_ERROR_STUB_LIBRARY; }

STUB(cuInit)
STUB(cuDriverGetVersion)
STUB(cuGetProcAddress)
STUB(cuGetProcAddress_v2)
STUB(cuGetExportTable)
STUB(cuDeviceGet)
STUB(cuDeviceGetCount)
STUB(cuDeviceGetAttribute)
STUB(cuCtxGetCurrent)
STUB(cuFuncSetAttribute)
STUB(cuLaunchKernel)
STUB(cuLaunchKernelEx)
STUB(cuModuleGetFunction)
STUB(cuModuleLoadData)
STUB(cuModuleLoadDataEx)
STUB(cuModuleUnload)
STUB(cuTensorMapEncodeIm2col)
STUB(cuTensorMapEncodeTiled)
