/* The freestanding side of an emulated x86 run (schedules/emulation/bochs.py): what a
 * TVM-compiled object imports, with no C library and no operating system under it.
 *
 * Python loads the linked image into the Bochs CPU, lays out the DLTensor arguments itself and
 * starts the CPU at mk_enter with the call's arguments in registers. Everything here is
 * single-threaded: a parallel loop runs as one task that covers every iteration.
 */
#include <stddef.h>
#include <stdint.h>

/* TVM's error hook: the message is kept for Python to read; the call's non-zero return ends
 * the run. */
char mk_error[2048];

void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  size_t at = 0;
  for (const char* s = kind; *s && at + 1 < sizeof mk_error; ++s) mk_error[at++] = *s;
  if (at + 2 < sizeof mk_error) mk_error[at++] = ':', mk_error[at++] = ' ';
  for (int32_t i = 0; i < n; ++i)
    for (const char* s = parts[i]; *s && at + 1 < sizeof mk_error; ++s) mk_error[at++] = *s;
  mk_error[at] = 0;
}

/* LLVM lowers zero fills to memset calls. Built with -fno-builtin and
 * -fno-tree-loop-distribute-patterns, so these loops are not turned back into calls to
 * themselves. */
void* memset(void* dst, int c, size_t n) {
  unsigned char* p = dst;
  while (n--) *p++ = (unsigned char)c;
  return dst;
}

void* memcpy(void* dst, const void* src, size_t n) {
  unsigned char* d = dst;
  const unsigned char* s = src;
  while (n--) *d++ = *s++;
  return dst;
}

/* Workspace: TVM frees its scratch buffers in the reverse order of allocation, so a stack of
 * 64-byte-aligned blocks in a fixed arena serves it. Python maps the arena and tells us its
 * place (mk_arena, mk_arena_size) before the call. */
uint64_t mk_arena, mk_arena_size;
static uint64_t top;
static uint64_t marks[256];
static int depth;

static void* alloc_workspace(int device_type, int device_id, uint64_t nbytes, int code_hint, int bits_hint) {
  (void)device_type, (void)device_id, (void)code_hint, (void)bits_hint;
  uint64_t size = (nbytes + 63) / 64 * 64;
  if (depth == 256 || top + size > mk_arena_size) return NULL;
  marks[depth++] = top;
  void* p = (void*)(mk_arena + top);
  top += size;
  return p;
}

static int free_workspace(int device_type, int device_id, void* ptr) {
  (void)device_type, (void)device_id;
  if (depth == 0 || (uint64_t)ptr != mk_arena + marks[depth - 1]) return -1;
  top = marks[--depth];
  return 0;
}

typedef struct {
  void* sync_handle;
  int32_t num_task;
} TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);

static int parallel_launch(FTVMParallelLambda flambda, void* cdata, int num_task) {
  (void)num_task;
  TVMParallelGroupEnv env = {NULL, 1};
  return flambda(0, &env, cdata);
}

/* The object declares these weak and null (the TVM runtime fills them when it loads a
 * module); these strong definitions win at link time. */
void* (*__TVMBackendAllocWorkspace)(int, int, uint64_t, int, int) = alloc_workspace;
int (*__TVMBackendFreeWorkspace)(int, int, void*) = free_workspace;
int (*__TVMBackendParallelLaunch)(FTVMParallelLambda, void*, int) = parallel_launch;

/* The emulator starts here with the entry function's address in r11 and its arguments in
 * rdi, rsi, rdx, rcx. The SysV ABI promises every function rsp + 8 divisible by 16 on entry,
 * and compilers rely on it: LLVM spills vectors with aligned moves (vmovaps to -0x80(%rsp)),
 * which fault when the promise is broken. Aligning rsp here and entering by a real call makes
 * the promise hold whatever stack pointer the emulator was started with. The function's return
 * lands on hlt, which stops the emulator with the result in rax. */
__attribute__((naked)) void mk_enter(void) {
  __asm__ volatile(
      "and $-16, %rsp\n\t"
      "call *%r11\n\t"
      "hlt");
}
