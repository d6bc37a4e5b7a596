"""Frozen tensors: a graph's parameters and buffers, bound as constants when it is compiled, and
watched so that a call after any write to one of them compiles again instead of answering with
the old values.

How a write is seen. PyTorch's version counters miss writes through `p.data` (an alias with a
counter of its own: `p.data.mul_(2)` changes neither p's version, object nor data pointer),
through numpy arrays or DLPack capsules sharing the memory, and inference tensors keep none.
What every write does need is a writable pointer to the memory, and PyTorch's copy-on-write
storages (`torch._lazy_clone`) hand one out only after giving the storage a copy of its own. So
each frozen tensor's storage is shared copy-on-write with a private clone when the graph is
compiled (no copy made), and each call checks that it still is: the same object, on the same
storage, still copy-on-write (about 0.26 us a tensor). One that is not was written, replaced
(`p.data = ...`, load_state_dict), or read through a writable pointer (torch.save, an eager
conv with grad on): its bits are compared with the clone's; equal, it is shared again (the
clone's memory is then freed); different, the graph compiles again.

What cannot be watched so is compared with a private copy before every call (reading it twice;
logged at WARNING once per graph), and watched the cheap way again once that becomes possible:
  - a storage something else holds too (a numpy array or a DLPack capsule from before the
    compile, another tensor, a view, a state_dict() kept around). Its next write would move the
    weight's memory, and an array taken before would then stop being the weight;
  - a storage PyTorch cannot share copy-on-write (numpy-backed: torch.from_numpy).
A raw address kept without a reference (an int from data_ptr() written through later) is not
seen, as PyTorch itself does not promise that memory stays the tensor's.
"""

from __future__ import annotations

import torch

from .report import Fallback
from .values import pairs

_SOLE = 2  # a storage's holders when only the frozen tensor holds it: it, and the storage's Python object
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # same-size integers, to compare bits
_is_cow = torch._C._is_cow_tensor
_storage_id = torch._C._storage_id  # the address of a tensor's storage (StorageImpl), which no call materializes


class Weights:
    """The frozen tensors of one compile (graph input position -> tensor), each watched."""

    def __init__(self, tensors: dict):
        self.watches = [_Watch(i, t) for i, t in tensors.items()]
        self.lost = False  # a tensor watched copy-on-write became one compared each call (not yet told)

    def unchanged(self, args) -> bool:
        """Every frozen tensor holds the values compiled with (the caller holds the graph's lock).
        Nothing took a writable pointer to a watched tensor's memory since (the same object, on
        the same storage, still copy-on-write), or its bits are those compiled with."""
        for w in self.watches:
            a = args[w.i]
            if w.why or a is not w.tensor or not _is_cow(a) or _storage_id(a) != w.storage:
                watched = not w.why
                if not w.same(a):
                    return False
                self.lost |= watched and bool(w.why)
        return True

    def unwatched(self) -> list[tuple[int, str, int]]:
        """(position, why, bytes) of the tensors compared with a copy on each call."""
        return [(w.i, w.why, w.copy.numel() * w.copy.element_size()) for w in self.watches if w.why]


class _Watch:
    __slots__ = ("i", "tensor", "storage", "copy", "why", "refused")

    def __init__(self, i: int, t: torch.Tensor):
        self.i = i
        self.copy = None
        self.refused = None  # the storage torch._lazy_clone refused: not tried again
        self._watch(t)

    def same(self, a: torch.Tensor) -> bool:
        """a's bits are the copy's; if so, a is watched from now on."""
        if a.shape != self.copy.shape or a.dtype != self.copy.dtype or not _same_bits(a, self.copy):
            return False
        self._watch(a)
        return True

    def _watch(self, t: torch.Tensor) -> None:
        """Share t's storage copy-on-write with a clone; else keep (or make) a private copy."""
        self.tensor = t
        self.storage = _storage_id(t)
        python_object = t.untyped_storage()  # there may be one already, kept alive by the storage: one holder
        holders = torch._C._storage_Use_Count(self.storage)
        del python_object
        why = "its memory has other holders (a numpy array, a DLPack capsule, a view or another tensor)" \
            if holders > _SOLE else ""
        if not why and self.storage == self.refused:
            why = self.why
        elif not why:
            try:
                with torch.no_grad():
                    clone = torch._lazy_clone(t)
                if not (_is_cow(t) and _is_cow(clone)):
                    raise RuntimeError("not made copy-on-write")
                self.copy, self.why = clone, ""
                return
            except RuntimeError as e:  # numpy-backed storages
                why = f"PyTorch cannot share it copy-on-write ({str(e).splitlines()[0][:80]})"
                self.refused = self.storage
        if self.copy is None:  # else the copy compared equal just now: kept
            with torch.no_grad():
                self.copy = t.detach().clone()
        self.why = why


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach(), b.detach()
    bits = _BITS.get(a.element_size())
    if bits is None or a.is_complex():
        return torch.equal(a, b)
    return torch.equal(a.view(bits), b.view(bits))


class Frozen(torch.nn.Module):
    """The graph as torch.export sees it: the frozen inputs are buffers (constants after the
    import), sizes are the call's values, the user's tensors are the only arguments, and the
    outputs are the graph's computed tensors, flattened. The buffers are copies: TVM's importer
    takes them through DLPack, and the compiled module keeps what it does not transform, which
    must not be the user's memory (that would be another holder of it, see above)."""

    def __init__(self, gm, kinds: list[str], args, output):
        super().__init__()
        self.graph_module = gm
        self.kinds = kinds
        self.output = output
        self.sizes = {i: int(a) for i, (k, a) in enumerate(zip(kinds, args)) if k == "size"}
        self.scalars = {i: (a.item(), a.dtype) for i, (k, a) in enumerate(zip(kinds, args)) if k == "scalar"}
        for i, k in enumerate(kinds):
            if k == "static":
                self.register_buffer(f"frozen_{i}", args[i].detach().clone())

    def forward(self, *tensors):
        it = iter(tensors)
        args = [getattr(self, f"frozen_{i}") if k == "static" else self.sizes[i] if k == "size" else
                torch.tensor(self.scalars[i][0], dtype=self.scalars[i][1]) if k == "scalar" else next(it)
                for i, k in enumerate(self.kinds)]
        computed = []
        for node, value in pairs(self.output, self.graph_module(*args)):
            if node.op != "placeholder":
                if not isinstance(value, torch.Tensor):
                    raise Fallback(f"the graph returns a {type(value).__name__}")
                computed.append(value)
        return tuple(computed)
