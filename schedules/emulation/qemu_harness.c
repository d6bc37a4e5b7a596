/* Runs one TVM-compiled PrimFunc ("main") on buffers held in files, so an ARM object can be
 * checked under qemu-user without cross-building the TVM runtime.
 *
 * usage: harness (CODE BITS NDIM D0 .. D{NDIM-1} PATH)...
 * CODE is the DLPack type code (0 int, 1 uint, 2 float). Each PATH holds the raw C-contiguous
 * bytes; after a successful call every buffer is written back, so outputs reach the caller
 * (inputs are rewritten unchanged, which keeps the protocol free of in/out flags).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tvm/ffi/c_api.h>

#define MAX_ARGS 64
#define MAX_DIMS 8

int __tvm_ffi_main(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result);

/* The object's only import: without the TVM runtime there is no error TLS to fill, so we
 * report straight away; the call's non-zero return then fails the process. */
void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  fprintf(stderr, "%s: ", kind);
  for (int32_t i = 0; i < n; ++i) fputs(parts[i], stderr);
  fputc('\n', stderr);
}

void TVMFFIErrorSetRaisedFromCStr(const char* kind, const char* message) {
  TVMFFIErrorSetRaisedFromCStrParts(kind, &message, 1);
}

/* Scratch buffers above TVM's stack limit go through these two pointers, which the TVM runtime
 * fills in when it loads a module. The object declares them weak and null; these strong
 * definitions win at link time. */
static void* alloc_workspace(int device_type, int device_id, uint64_t nbytes, int code_hint, int bits_hint) {
  (void)device_type, (void)device_id, (void)code_hint, (void)bits_hint;
  return aligned_alloc(64, (size_t)((nbytes + 63) / 64 * 64));
}

static int free_workspace(int device_type, int device_id, void* ptr) {
  (void)device_type, (void)device_id;
  free(ptr);
  return 0;
}

void* (*__TVMBackendAllocWorkspace)(int, int, uint64_t, int, int) = alloc_workspace;
int (*__TVMBackendFreeWorkspace)(int, int, void*) = free_workspace;

static void die(const char* what, const char* detail) {
  fprintf(stderr, "harness: %s %s\n", what, detail);
  exit(2);
}

int main(int argc, char** argv) {
  static DLTensor t[MAX_ARGS];
  static int64_t shape[MAX_ARGS][MAX_DIMS];
  static const char* path[MAX_ARGS];
  static size_t nbytes[MAX_ARGS];
  static TVMFFIAny packed[MAX_ARGS];
  int n = 0;

  for (int i = 1; i < argc; ++n) {
    if (n == MAX_ARGS || i + 3 > argc) die("bad argument list near", argv[i]);
    int code = atoi(argv[i]), bits = atoi(argv[i + 1]), ndim = atoi(argv[i + 2]);
    i += 3;
    if (ndim < 0 || ndim > MAX_DIMS || i + ndim + 1 > argc) die("bad ndim for arg", argv[i - 1]);
    size_t size = (size_t)(bits / 8);
    for (int d = 0; d < ndim; ++d) size *= (size_t)(shape[n][d] = atoll(argv[i++]));
    path[n] = argv[i++];
    nbytes[n] = size;

    /* TVM's codegen may emit aligned vector loads for buffers it assumes 64-byte aligned;
     * aligned_alloc wants a non-zero multiple of the alignment. */
    void* data = aligned_alloc(64, (size + 64) & ~(size_t)63);
    FILE* f = fopen(path[n], "rb");
    if (!data || !f || fread(data, 1, size, f) != size) die("cannot read", path[n]);
    fclose(f);

    t[n] = (DLTensor){.data = data, .device = {kDLCPU, 0}, .ndim = ndim,
                      .dtype = {(uint8_t)code, (uint8_t)bits, 1}, .shape = shape[n]};
    memset(&packed[n], 0, sizeof packed[n]);
    packed[n].type_index = kTVMFFIDLTensorPtr;
    packed[n].v_ptr = &t[n];
  }

  TVMFFIAny result;
  memset(&result, 0, sizeof result);
  if (__tvm_ffi_main(NULL, packed, n, &result) != 0) {
    fprintf(stderr, "harness: __tvm_ffi_main failed\n");
    return 1;
  }
  for (int k = 0; k < n; ++k) {
    FILE* f = fopen(path[k], "wb");
    if (!f || fwrite(t[k].data, 1, nbytes[k], f) != nbytes[k] || fclose(f) != 0) die("cannot write", path[k]);
  }
  return 0;
}
