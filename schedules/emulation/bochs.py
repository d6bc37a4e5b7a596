"""Run a TVM-compiled x86 module on the Bochs CPU (bochscpu-python): AVX-512 on any x86 host.

Why: QEMU cannot execute AVX-512 and Intel's emulator cannot be installed here; Bochs' CPU,
as a library, models a Tiger Lake with AVX-512 F/DQ/CD/BW/VL. The module's object is linked
with a freestanding harness (bochs_harness.c: TVM's error hook, the workspace allocator, a
one-task parallel launch, memset) into a static image, whose segments are mapped into a 64-bit
address space we build page by page. Each argument gets its own pages with an unmapped page on
either side, its end placed at the end of its last page (rounded up to 64 bytes, the alignment
TVM assumes), so a kernel that reads or writes past a buffer's end stops on a page fault
instead of corrupting memory silently. The call is __tvm_ffi_main(NULL, args, n, &result)
with DLTensor arguments laid out here, made by the harness's mk_enter, which aligns the stack
as the x86-64 ABI requires and returns into a hlt.

One op may be called from several Python threads: writing the module out and the cached work
folder and harness object are guarded by one lock, the emulator by another; each call links in
a folder of its own.
"""

from __future__ import annotations

import ctypes
import functools
import shutil
import struct
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

from .arguments import DLPACK_CODE, check_args

HARNESS = Path(__file__).with_name("bochs_harness.c")
PACKAGE = "bochscpu-python==0.3.1"  # 0.4.0 needs glibc 2.38 and does not import on Debian 12
PAGE = 4096
DL_TENSOR_PTR = 7  # kTVMFFIDLTensorPtr
MAX_INSTRUCTIONS = 2_000_000_000  # a runaway kernel fails instead of hanging a test
ARENA_BYTES = 16 << 20  # TVM workspace (scratch buffers above its stack limit)
_LOCK = threading.Lock()  # Bochs' physical memory and CPU are per process
# TVM's write_to_file on a module two threads share frees memory twice (the process aborts),
# and the lru_caches below could build the folder or the harness twice: all under this lock.
_BUILD_LOCK = threading.Lock()

# Guest virtual layout (long mode, 4 KiB pages): the image where the linker put it (0x400000),
# arguments from ARG_BASE each in its own range, the workspace arena, the stack.
ARG_BASE = 0x10_0000_0000
ARG_STRIDE = 0x1_0000_0000  # 4 GiB of address space per argument; its guard pages are free
ARENA_BASE = 0x20_0000_0000
STACK_TOP = 0x30_0000_0000
STACK_BYTES = 1 << 20
META_BASE = 0x28_0000_0000  # DLTensors, shapes, the TVMFFIAny array, the result slot


class EmulatorError(RuntimeError):
    """The emulated kernel faulted (a page fault names the buffer it ran past), failed TVM's
    argument checks, or ran too long."""


class EmulatorUnavailable(RuntimeError):
    """bochscpu-python is not installed or does not import here."""


def _bochs():
    try:
        import bochscpu
        import bochscpu.cpu
        import bochscpu.memory
    except ImportError as err:
        raise EmulatorUnavailable(f"x86 emulation needs {PACKAGE} (pip install '{PACKAGE}'): {err}") from None
    return bochscpu


def available() -> str | None:
    """None when emulation works here, else why not."""
    try:
        _bochs()
    except EmulatorUnavailable as err:
        return str(err)
    if shutil.which("gcc") is None:
        return "x86 emulation links kernels with gcc, which is not on PATH"
    return None


@functools.lru_cache(maxsize=None)
def _workdir() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="tvm-bochs-")


@functools.lru_cache(maxsize=None)
def _harness_object() -> Path:
    out = Path(_workdir().name) / "harness.o"
    subprocess.run(["gcc", "-O2", "-std=c11", "-Wall", "-ffreestanding", "-fno-builtin",
                    "-fno-tree-loop-distribute-patterns", "-fno-pie", "-c", str(HARNESS), "-o", str(out)],
                   check=True, capture_output=True, text=True)
    return out


def link(lib) -> tuple[list[tuple[int, bytes, int, bool]], dict[str, int]]:
    """The image's loadable segments (address, file bytes, size in memory, writable) and its
    symbols, for `lib` (a tvm.compile result for an x86-64 target)."""
    with _BUILD_LOCK:
        harness = _harness_object()
        tmp = Path(tempfile.mkdtemp(dir=_workdir().name))
        obj, image = tmp / "kernel.o", tmp / "image"
        try:
            lib.mod.write_to_file(str(obj))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    # The rest touches only this call's folder, so threads may link at once.
    try:
        proc = subprocess.run(["gcc", "-static", "-nostdlib", "-no-pie", "-Wl,-e,mk_enter", "-Wl,--build-id=none",
                               "-o", str(image), str(harness), str(obj)], capture_output=True, text=True)
        if proc.returncode:
            raise EmulatorError(f"linking the kernel with the freestanding harness failed:\n{proc.stderr}")
        data = image.read_bytes()
        symbols = {}
        for line in subprocess.run(["nm", str(image)], check=True, capture_output=True, text=True).stdout.splitlines():
            parts = line.split()
            if len(parts) == 3:
                symbols[parts[2]] = int(parts[0], 16)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _segments(data), symbols


def _segments(elf: bytes) -> list[tuple[int, bytes, int, bool]]:
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise EmulatorError("not a 64-bit ELF image")
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    out = []
    for i in range(phnum):
        p_type, p_flags, p_offset, p_vaddr, _, p_filesz, p_memsz, _ = struct.unpack_from("<IIQQQQQQ", elf, phoff + i * phentsize)
        if p_type == 1:  # PT_LOAD
            out.append((p_vaddr, elf[p_offset:p_offset + p_filesz], p_memsz, bool(p_flags & 2)))
    return out


class _Memory:
    """Guest pages: host pages inserted at guest-physical addresses, mapped by one page table."""

    def __init__(self, b):
        self.b = b
        self.pt = b.memory.PageMapLevel4Table()
        self.host: dict[int, int] = {}  # guest virtual page -> host address
        self.inserted: list[int] = []  # guest-physical pages, removed again after the run
        self.next_gpa = 0x100_0000

    def map(self, gva: int, size: int, writable: bool = True) -> None:
        for page in range(gva // PAGE * PAGE, -(-(gva + size) // PAGE) * PAGE, PAGE):
            if page in self.host:
                continue
            hva = self.b.memory.allocate_host_page()
            ctypes.memset(hva, 0, PAGE)
            self.b.memory.page_insert(self.next_gpa, hva)
            self.inserted.append(self.next_gpa)
            # 1: writable; code and read-only data are mapped as such, so a stray write faults.
            self.pt.insert(page, self.next_gpa, 1 if writable else 0)
            self.host[page] = hva
            self.next_gpa += PAGE

    def write(self, gva: int, data: bytes | memoryview) -> None:
        data = memoryview(data).cast("B")
        done = 0
        while done < len(data):
            page, off = (gva + done) // PAGE * PAGE, (gva + done) % PAGE
            n = min(PAGE - off, len(data) - done)
            ctypes.memmove(self.host[page] + off, bytes(data[done:done + n]), n)
            done += n

    def read(self, gva: int, size: int) -> bytes:
        out = bytearray(size)
        done = 0
        while done < size:
            page, off = (gva + done) // PAGE * PAGE, (gva + done) % PAGE
            n = min(PAGE - off, size - done)
            out[done:done + n] = ctypes.string_at(self.host[page] + off, n)
            done += n
        return bytes(out)

    def commit(self, cr3: int) -> None:
        # The table's own pages belong to self.pt (freed with it); only their mapping is ours.
        for hva, gpa in self.pt.commit(cr3):
            self.b.memory.page_insert(gpa, hva)
            self.inserted.append(gpa)

    def release(self) -> None:
        # Physical memory is per process: the next run must not find this run's pages mapped.
        for gpa in self.inserted:
            self.b.memory.page_remove(gpa)
        for hva in self.host.values():
            self.b.memory.release_host_page(hva)
        self.inserted.clear()
        self.host.clear()


def _segment(b, selector: int, attr: int):
    s = b.Segment()
    s.present, s.selector, s.base, s.limit, s.attr = True, selector, 0, 0xFFFF_FFFF, attr
    return s


def run(lib, args: list[np.ndarray], outputs: list[int]) -> list[np.ndarray]:
    """Call `lib`'s "main" on `args` under Bochs; return copies of args[k] for k in `outputs`."""
    check_args(args, outputs)
    b = _bochs()
    segments, symbols = link(lib)
    with _LOCK:
        return _run(b, segments, symbols, args, outputs)


def _run(b, segments, symbols, args, outputs):
    mem = _Memory(b)
    sess = None
    try:
        for vaddr, data, memsz, writable in segments:
            mem.map(vaddr, memsz, writable)
            mem.write(vaddr, data)
        # Arguments: each right-aligned (to 64 bytes) against an unmapped page.
        where = []
        for i, a in enumerate(args):
            size = max(a.nbytes, 1)
            span = -(-size // 64) * 64
            pages = -(-span // PAGE) * PAGE
            start = ARG_BASE + i * ARG_STRIDE + PAGE + pages - span
            mem.map(ARG_BASE + i * ARG_STRIDE + PAGE, pages)
            mem.write(start, a.tobytes())
            where.append(start)
        mem.map(ARENA_BASE, ARENA_BYTES)
        mem.write(symbols["mk_arena"], struct.pack("<Q", ARENA_BASE))
        mem.write(symbols["mk_arena_size"], struct.pack("<Q", ARENA_BYTES))
        # DLTensor {data, device{type, id}, ndim, dtype{code, bits, lanes}, shape, strides,
        # byte_offset}: 48 bytes; then the shapes; then TVMFFIAny {type_index, pad, ptr}.
        meta = bytearray()
        shapes_at = META_BASE + 48 * len(args)
        shape_blob = bytearray()
        for i, a in enumerate(args):
            shape_ptr = shapes_at + len(shape_blob)
            shape_blob += struct.pack(f"<{a.ndim}q", *a.shape) if a.ndim else b""
            meta += struct.pack("<QiiiBBHQQQ", where[i], 1, 0, a.ndim, DLPACK_CODE[a.dtype.kind],
                                a.dtype.itemsize * 8, 1, shape_ptr, 0, 0)
        meta += shape_blob
        meta += bytes(-len(meta) % 16)
        anys_at = META_BASE + len(meta)
        for i in range(len(args)):
            meta += struct.pack("<iiQ", DL_TENSOR_PTR, 0, META_BASE + 48 * i)
        result_at = META_BASE + len(meta)
        meta += bytes(16)
        mem.map(META_BASE, len(meta))
        mem.write(META_BASE, meta)
        mem.map(STACK_TOP - STACK_BYTES, STACK_BYTES)

        cr3 = 0x10_0000
        mem.commit(cr3)

        sess = b.Session()
        sess.missing_page_handler = _missing_page
        state = b.State()
        b.cpu.set_long_mode(state)
        # set_long_mode leaves these off: CR0.MP (bit 1); CR4.OSFXSR, OSXMMEXCPT (9, 10) for
        # SSE, CR4.OSXSAVE (18) for XCR0 and with it AVX and AVX-512.
        state.cr0 = int(state.cr0) | 1 << 1
        state.cr4 = int(state.cr4) | 1 << 9 | 1 << 10 | 1 << 18
        state.xcr0 = 0xE7  # x87, SSE, AVX and the three AVX-512 state components
        state.mxcsr = 0x1F80
        state.cr3 = cr3
        # Not a jump to the function over a hand-made return address: entered by mk_enter's
        # call, it finds rsp = 8 mod 16 as the ABI promises, whatever rsp starts at here.
        state.rip, state.r11 = symbols["mk_enter"], symbols["__tvm_ffi_main"]
        state.rsp = STACK_TOP - 64
        state.rdi, state.rsi, state.rdx, state.rcx = 0, anys_at, len(args), result_at
        # Ring 0, so that the hlt we return into is allowed (and stops the run) rather than a #GP.
        state.cs = _segment(b, 0x08, 0x209B)  # 64-bit code, DPL 0
        data_seg = _segment(b, 0x10, 0xC93)  # data, DPL 0
        state.ds = state.ss = state.es = state.fs = state.gs = data_seg
        sess.cpu.state = state

        fault: list = []
        count = [0]

        def on_exception(s, cpu_id, vector, error_code):
            fault.append((int(vector), int(error_code), s.cpu.state.cr2, s.cpu.state.rip))
            s.stop()

        def on_hlt(s, cpu_id):
            s.stop()

        def on_branch(s, cpu_id, *rest):  # a cheap watchdog: branches, not every instruction
            count[0] += 1
            if count[0] > MAX_INSTRUCTIONS // 8:
                fault.append(("timeout", 0, 0, s.cpu.state.rip))
                s.stop()

        hook = b.Hook()
        hook.exception = on_exception
        hook.hlt = on_hlt
        hook.cnear_branch_taken = on_branch
        sess.run([hook])

        if fault:
            raise EmulatorError(_describe(fault[0], where, args, symbols))
        rax = sess.cpu.state.rax & 0xFFFF_FFFF
        if rax:
            msg = mem.read(symbols["mk_error"], 2048).split(b"\0", 1)[0].decode(errors="replace")
            raise EmulatorError(f"the kernel returned {rax} under emulation: {msg}")
        return [np.frombuffer(mem.read(where[k], args[k].nbytes), dtype=args[k].dtype).reshape(args[k].shape).copy()
                for k in outputs]
    finally:
        # Bochs has one CPU per process: a session still alive when the next run makes its own
        # aborts the process ("free(): invalid pointer"). A caller that keeps an EmulatorError
        # keeps this frame through its traceback, so the frame must not keep the session.
        sess = None
        mem.release()


def _missing_page(gpa):
    raise EmulatorError(f"access to unmapped guest-physical address {gpa:#x}")


_VECTORS = {0: "divide error", 6: "invalid opcode (#UD: an instruction this CPU model lacks)",
            13: "general protection fault", 14: "page fault"}


def _describe(fault, where, args, symbols) -> str:
    vector, code, cr2, rip = fault
    if vector == "timeout":
        return f"the kernel ran past {MAX_INSTRUCTIONS // 8} taken branches (rip {rip:#x}): a hang?"
    what = _VECTORS.get(vector, f"exception {vector}")
    text = f"{what} at rip {rip:#x}"
    if vector == 14:
        access = "write" if code & 2 else "read"
        text += f", {access} of {cr2:#x}"
        for i, a in enumerate(args):
            lo = ARG_BASE + i * ARG_STRIDE
            if lo <= cr2 < lo + ARG_STRIDE:
                start, end = where[i], where[i] + a.nbytes
                side = "past the end" if cr2 >= end else "before the start"
                off = cr2 - end if cr2 >= end else start - cr2
                text += f": {off} bytes {side} of args[{i}] (shape {a.shape}, {a.dtype})"
    return text
