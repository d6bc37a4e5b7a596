"""What a conv2d is, as values: its parameters (ConvParams), every size of the layer in the
blocked layouts (Geometry), the post-ops fused into its store (PostOps), the quantization of
the ARM path (Quantization), the cache budgets its plans divide (ConvBlocking), and how an
output row is cut into tiles (segments). No TVM here: every family plans from these."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from intrinsics.templates import DEFAULT_CLIP
from microkernels import NO_EPILOGUE, Epilogue
from microkernels.f32_gemm import ACTIVATIONS

from ..common.targets import check_elements, dtype_name, host_cache_bytes, positive_int
from ..common.tir import ceil_div


def _pair(name: str, v, allow_zero: bool = False) -> tuple[int, int]:
    """An int, or a tuple of one or two ints (PyTorch's `stride=(2,)`), as (h, w)."""
    vals = tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    if len(vals) == 1:
        vals = vals * 2
    if len(vals) != 2:
        raise ValueError(f"{name} must be an int or a tuple of one or two ints, got {v!r}")
    lo = 0 if allow_zero else 1
    for x in vals:
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
            raise TypeError(f"{name} must be an int or a tuple of one or two ints, got {v!r}")
        if x < lo:
            raise ValueError(f"{name} must be >= {lo}, got {v!r}")
    return int(vals[0]), int(vals[1])


PADDING_FORMS = "an int, (h, w), (top, left, bottom, right), 'same' or 'valid'"


def _padding(p, kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int]) -> tuple[int, int, int, int]:
    """int, (p,), (h, w), (top, left, bottom, right), "valid" or "same" -> (top, left, bottom,
    right). "same" pads dilation * (k - 1) per axis as PyTorch does, the odd one at the bottom
    and right, and like PyTorch only at stride 1 (a strided output cannot have the input's size)."""
    if isinstance(p, str):
        if p == "valid":
            return (0, 0, 0, 0)
        if p != "same":
            raise ValueError(f"padding must be {PADDING_FORMS}, got {p!r}")
        if stride != (1, 1):
            raise ValueError(f"padding='same' needs stride 1, as in PyTorch; got stride {stride}: give the padding as ints")
        total = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return (total[0] // 2, total[1] // 2, total[0] - total[0] // 2, total[1] - total[1] // 2)
    if isinstance(p, (tuple, list)):
        if len(p) not in (1, 2, 4):
            raise ValueError(f"padding must be {PADDING_FORMS}, got {p!r}")
        vals = tuple(p) * 4 if len(p) == 1 else (p[0], p[1], p[0], p[1]) if len(p) == 2 else tuple(p)
    else:
        vals = (p,) * 4
    for x in vals:
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
            raise TypeError(f"padding must be {PADDING_FORMS}, got {p!r}")
        if x < 0:
            raise ValueError(f"padding must be >= 0, got {p!r}")
    return tuple(int(x) for x in vals)


def _shape(name: str, s, rank: int) -> tuple[int, ...]:
    if not isinstance(s, (tuple, list)) or len(s) != rank:
        raise ValueError(f"{name} must be a tuple of {rank} ints, got {s!r}")
    return tuple(positive_int(f"{name}[{i}]", v) for i, v in enumerate(s))


def depthwise(channels: int, groups: int) -> bool:
    """A depthwise layer: one input channel per group (any number of output channels each)."""
    return groups == channels > 1


# Channels per group the depthwise family's grouped kernel takes: divisors of AVX2's 8 lanes,
# so no group straddles a vector (or a 16-channel block).
LANE_GROUPS = (2, 4, 8)


def lane_groups(channels: int, out_channels: int, groups: int) -> bool:
    """Groups of 2, 4 or 8 channels with as many outputs each (ResNeXt's, RegNet's): they run
    in the vector lanes on the depthwise family's grouped kernel (conv/depthwise.py)."""
    if groups < 2 or channels % groups or out_channels != channels:
        return False
    return channels // groups in LANE_GROUPS


def block_diagonal(channels: int, out_channels: int, groups: int, block: int) -> bool:
    """A grouped layer whose groups are narrower than a block (ResNeXt's 4 or 8 channels per
    group) and tile it: it runs as whole-block groups with block-diagonal weights, on the plain
    blocked layout in and out (grouped.widen)."""
    if groups < 1 or channels % groups or out_channels % groups:
        return False
    cg, og = channels // groups, out_channels // groups
    return 1 < cg < block and block % cg == 0 and og % cg == 0 and channels % block == 0


@dataclass(frozen=True)
class ConvParams:
    """One conv2d layer as the user gives it: NCHW data and OIHW weight shapes, stride and
    dilation (an int or (h, w), a 1-tuple as PyTorch allows), padding (an int, (h, w), (top,
    left, bottom, right), "same" or "valid", as F.conv2d takes them) and groups; checked and normalized on construction (shapes and stride/dilation tuples, padding
    (top, left, bottom, right), groups an int). Whether they fit together is geometry()'s
    check, which knows the blocked layouts."""

    data_shape: tuple
    weight_shape: tuple
    stride: object = 1
    padding: object = 0
    dilation: object = 1
    groups: object = 1

    def __post_init__(self):
        set_ = functools.partial(object.__setattr__, self)
        set_("data_shape", _shape("data_shape", self.data_shape, 4))
        set_("weight_shape", _shape("weight_shape", self.weight_shape, 4))
        set_("stride", _pair("stride", self.stride))
        set_("dilation", _pair("dilation", self.dilation))
        set_("padding", _padding(self.padding, self.weight_shape[2:], self.stride, self.dilation))
        set_("groups", positive_int("groups", self.groups))


@dataclass(frozen=True)
class ConvBlocking:
    """Cache budgets in bytes. None: the host's cache as sysfs gives it (L2 512 KiB, L1d 32 KiB
    where it does not say); the golden assembly pins both so it does not depend on the host."""

    l2_bytes: int | None = None
    l1_bytes: int | None = None

    def __post_init__(self):
        for name in ("l2_bytes", "l1_bytes"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, positive_int(name, getattr(self, name)))

    @property
    def l2(self) -> int:
        return self.l2_bytes if self.l2_bytes is not None else host_cache_bytes(2, 512 * 1024)

    @property
    def l1(self) -> int:
        return self.l1_bytes if self.l1_bytes is not None else host_cache_bytes(1, 32 * 1024)

    @property
    def image_budget(self) -> int:  # a layer's input this small is packed whole, once
        return self.l2 // 2

    @property
    def band_budget(self) -> int:  # otherwise a band's input must fit here
        return self.l2 // 4


@dataclass(frozen=True)
class Geometry:
    """Every size of one conv2d layer, in the blocked layouts."""

    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    stride: tuple[int, int]
    pad: tuple[int, int, int, int]  # top, left, bottom, right
    dilation: tuple[int, int]
    groups: int
    block: int  # output block (= the tile's NR)

    @property
    def cg(self) -> int:
        return self.c // self.groups

    @property
    def og(self) -> int:
        return self.o // self.groups

    @property
    def bi(self) -> int:
        """Input block: the full block, or the whole group when it has fewer channels (first layer)."""
        return min(self.block, self.cg)

    @property
    def nb(self) -> int:  # input blocks per group
        return ceil_div(self.cg, self.bi)

    @property
    def ob(self) -> int:  # output blocks per group
        return ceil_div(self.og, self.block)

    @functools.cached_property  # every call checks its arrays against these
    def out_hw(self) -> tuple[int, int]:
        (sh, sw), (dh, dw) = self.stride, self.dilation
        t, l, b, r = self.pad
        return ((self.h + t + b - (self.kh - 1) * dh - 1) // sh + 1,
                (self.w + l + r - (self.kw - 1) * dw - 1) // sw + 1)

    @functools.cached_property  # every call checks its arrays against these
    def data_shape(self) -> tuple:
        return (self.n, self.groups * self.nb, self.h, self.w, self.bi)

    @functools.cached_property  # every call checks its arrays against these
    def weight_shape(self) -> tuple:
        return (self.groups * self.ob, self.nb, self.kh, self.kw, self.bi, self.block)

    @functools.cached_property  # every call checks its arrays against these
    def out_shape(self) -> tuple:
        return (self.n, self.groups * self.ob, *self.out_hw, self.block)

    def input_rows(self, out_rows: int) -> int:
        """Input rows (padding included) that `out_rows` consecutive output rows read."""
        return (out_rows - 1) * self.stride[0] + (self.kh - 1) * self.dilation[0] + 1

    def input_cols(self, out_cols: int) -> int:
        """Input columns (padding included) that `out_cols` consecutive output pixels read."""
        return (out_cols - 1) * self.stride[1] + (self.kw - 1) * self.dilation[1] + 1

    @functools.cached_property  # every call checks its arrays against these
    def bias_shape(self) -> tuple:  # per output block: NCHWc's channel order
        return (self.groups * self.ob, self.block)

    @property
    def flops(self) -> int:
        oh, ow = self.out_hw
        return 2 * self.n * self.o * oh * ow * self.cg * self.kh * self.kw

    @property
    def padded(self) -> bool:
        return any(self.pad)

    @property
    def depthwise(self) -> bool:
        return depthwise(self.c, self.groups)

    @classmethod
    def of(cls, p: ConvParams, block: int = 16) -> "Geometry":
        """The layer's sizes in the blocked layouts, once its shapes and parameters are checked to
        fit together (raises ValueError). block: the output block, the tile's NR."""
        (n, c, h, w), (o, cg, kh, kw) = p.data_shape, p.weight_shape
        stride, dilation, pad, groups = p.stride, p.dilation, p.padding, p.groups
        if c % groups or o % groups:
            raise ValueError(f"groups={groups} must divide both the input channels ({c}) and the output channels ({o})")
        if cg != c // groups:
            raise ValueError(f"weight_shape[1] must be in_channels/groups = {c}/{groups} = {c // groups}, got {cg}")
        eh, ew = (kh - 1) * dilation[0] + 1, (kw - 1) * dilation[1] + 1
        if eh > h + pad[0] + pad[2] or ew > w + pad[1] + pad[3]:
            raise ValueError(f"the (dilated) kernel {eh}x{ew} is larger than the padded input "
                             f"{h + pad[0] + pad[2]}x{w + pad[1] + pad[3]}")
        g = cls(n, c, h, w, o, kh, kw, stride, pad, dilation, groups, block)
        # The user's arrays and the padded input, before any planning (a padding of 10**9 must be
        # refused here, not iterated over). Each family checks its own blocked buffers, whose
        # channel padding differs from family to family.
        check_elements(data=(n, c, h, w), weight=(o, cg, kh, kw), output=(n, o, *g.out_hw),
                       padded_input=(n, c, h + pad[0] + pad[2], w + pad[1] + pad[3]))
        return g


@dataclass(frozen=True)
class PostOps:
    """What a conv2d applies to its output tiles before their one store (oneDNN's post-ops):
    out = act(conv + bias[o] + residual), each part optional, act None, "relu" or "clip" (to
    the `clip` bounds; (0, 6) is ReLU6). The layer takes the extra inputs in this order:
    data, weight, bias (op.pack_bias), residual (blocked output shape)."""

    bias: bool = False
    residual: bool = False
    activation: str | None = None
    clip: tuple[float, float] = DEFAULT_CLIP

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        for label, v in (("bias", self.bias), ("residual", self.residual)):
            if not isinstance(v, bool):
                raise TypeError(f"{label} must be True or False, got {v!r}")
        try:
            lo, hi = (float(b) for b in self.clip)
        except (TypeError, ValueError):
            raise ValueError(f"clip must be two numbers (lo, hi), got {self.clip!r}") from None
        if not lo < hi:
            raise ValueError(f"clip bounds must satisfy lo < hi, got {self.clip!r}")
        object.__setattr__(self, "clip", (lo, hi))

    @property
    def epilogue(self) -> Epilogue:
        return Epilogue(self.bias, self.residual, self.activation) if self else NO_EPILOGUE

    def __bool__(self) -> bool:
        return self.bias or self.residual or self.activation is not None

    @property
    def label(self) -> str:
        """"bias+residual+relu", or "" for none (logs and reports)."""
        return "+".join(p for p, on in (("bias", self.bias), ("residual", self.residual),
                                        (self.activation or "", self.activation)) if on)


NO_POST_OPS = PostOps()


OUTPUT_DTYPES = ("int32", "uint8", "int8", "float32")


@dataclass(frozen=True)
class Quantization:
    """The quantized conv2d: acc = sum (x - input_zero_point) * (w - weight_zero_point) in int32
    (+ bias, an int32 per output channel at scale input_scale * weight_scale, as ONNX
    QLinearConv's). dtype "int8" or "uint8", or "int16" for data the legalize pass already widened;
    weight_dtype None means int16 with int16 data, else int8. The zero points' ranges depend on
    the dtypes and are checked by the family (int8).

    output_dtype "int32" returns acc. "uint8"/"int8" requantize it as ONNX QuantizeLinear does:
    q = saturate(round_half_even(float32(acc) * m[o]) + output_zero_point), with the float32
    multiplier m[o] = input_scale * weight_scale[o] / output_scale (float32 arithmetic).
    "float32" dequantizes: float32(acc) * input_scale * weight_scale[o]. weight_scale is one
    float or one per output channel; scales must be finite and positive.

    A fused residual add (PostOps.residual, 8-bit outputs): the QDQ graph's quantized conv output
    y, dequantized and added to a dequantized residual r (the output's dtype, residual_scale,
    residual_zero_point), the sum quantized again (sum_scale, sum_zero_point), as ONNX Runtime's
    QLinearAdd computes it, with float32 ratios a = output_scale / sum_scale and
    b = residual_scale / sum_scale:
        z = saturate(round_half_even((y - output_zero_point) * a + (r - residual_zero_point) * b)
                     + sum_zero_point)
    ONNX's own rule divides the float sum by sum_scale instead; the two differ by at most one
    quantization step, where a value lands within a rounding error of a half."""

    dtype: object = "int8"
    weight_dtype: object = None
    input_zero_point: object = 0
    weight_zero_point: object = 0
    output_dtype: object = "int32"
    input_scale: object = None
    weight_scale: object = None
    output_scale: object = None
    output_zero_point: object = 0
    # "NHWC": data (N, H, W, C) and output (N, OH, OW, O), channels-last as the x86 pack and
    # accumulators are, so neither stage transposes (OIHW weights either way). x86 only.
    data_layout: object = "NCHW"
    residual_scale: object = None
    residual_zero_point: object = 0
    sum_scale: object = None
    sum_zero_point: object = 0
    # 7: every pair of weights a vpmaddubsw tile multiplies together (input channels 2i, 2i + 1 at
    # one tap) has |w_a| + |w_b| <= 128, as 7-bit weights ([-64, 64]: quantize_static's
    # reduce_range) always do; x86 layers without VNNI then run on that tile, exact, and packing
    # refuses weights that break the bound. 8: any weights (the int16 upcast there).
    weight_bits: object = 8

    def __post_init__(self):
        if self.data_layout not in ("NCHW", "NHWC"):
            raise ValueError(f"data_layout must be 'NCHW' or 'NHWC', got {self.data_layout!r}")
        dtype = dtype_name("dtype", self.dtype)
        weight = dtype_name("weight_dtype", self.weight_dtype)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "weight_dtype", weight or ("int16" if dtype == "int16" else "int8"))
        out = dtype_name("output_dtype", self.output_dtype) or "int32"
        if out not in OUTPUT_DTYPES:
            raise ValueError(f"output_dtype must be one of {OUTPUT_DTYPES}, got {out!r}")
        object.__setattr__(self, "output_dtype", out)
        need = {"int32": (), "float32": ("input_scale", "weight_scale"),
                "uint8": ("input_scale", "weight_scale", "output_scale"),
                "int8": ("input_scale", "weight_scale", "output_scale")}[out]
        for name in ("input_scale", "weight_scale", "output_scale"):
            value = getattr(self, name)
            if name in need and value is None:
                raise ValueError(f"output_dtype {out!r} needs {', '.join(need)}; {name} is missing")
            if name not in need and value is not None:
                raise ValueError(f"{name} does not apply to output_dtype {out!r} (it takes {', '.join(need) or 'no scales'})")
            if value is not None:
                object.__setattr__(self, name, _scales(name, value, per_channel=name == "weight_scale"))
        zp = self.output_zero_point
        if isinstance(zp, (bool, np.bool_)) or not isinstance(zp, (int, np.integer)):
            raise TypeError(f"output_zero_point must be an int, got {type(zp).__name__}")
        lo, hi = {"uint8": (0, 255), "int8": (-128, 127)}.get(out, (0, 0))
        if not lo <= zp <= hi:
            what = f"[{lo}, {hi}] for {out}" if out in ("uint8", "int8") else f"0 for output_dtype {out!r}"
            raise ValueError(f"output_zero_point={zp} is out of range: must be {what}")
        object.__setattr__(self, "output_zero_point", int(zp))
        self._check_residual(out, lo, hi)
        bits = self.weight_bits
        if isinstance(bits, (bool, np.bool_)) or not isinstance(bits, (int, np.integer)) or bits not in (7, 8):
            raise ValueError(f"weight_bits must be 7 (weight pairs within vpmaddubsw's bound, as 7-bit weights are) "
                             f"or 8, got {bits!r}")
        if bits == 7 and self.weight_dtype == "int16":
            raise ValueError("weight_bits=7 describes 8-bit weights; int16 (legalized) weights take the upcast")
        object.__setattr__(self, "weight_bits", int(bits))

    def _check_residual(self, out: str, lo: int, hi: int) -> None:
        scales = (self.residual_scale, self.sum_scale)
        if all(v is None for v in scales):
            if self.residual_zero_point or self.sum_zero_point:
                raise ValueError("residual_zero_point and sum_zero_point apply to a fused residual add "
                                 "(residual_scale and sum_scale)")
            return
        if out not in ("uint8", "int8"):
            raise ValueError(f"a quantized residual add (residual_scale, sum_scale) needs an 8-bit output_dtype, got {out!r}")
        if None in scales:
            raise ValueError("a quantized residual add needs both residual_scale and sum_scale")
        for name in ("residual_scale", "sum_scale"):
            object.__setattr__(self, name, _scales(name, getattr(self, name), per_channel=False))
        for name in ("residual_zero_point", "sum_zero_point"):
            zp = getattr(self, name)
            if isinstance(zp, (bool, np.bool_)) or not isinstance(zp, (int, np.integer)):
                raise TypeError(f"{name} must be an int, got {type(zp).__name__}")
            if not lo <= zp <= hi:
                raise ValueError(f"{name}={zp} is out of range: must be [{lo}, {hi}] for {out} (the residual and the "
                                 "sum take the output's dtype)")
            object.__setattr__(self, name, int(zp))

    @property
    def adds_residual(self) -> bool:
        return self.sum_scale is not None

    def residual_ratios(self) -> tuple[float, float]:
        """(output_scale / sum_scale, residual_scale / sum_scale), each in float32."""
        sz = np.float32(self.sum_scale[0])
        return float(np.float32(self.output_scale[0]) / sz), float(np.float32(self.residual_scale[0]) / sz)

    @property
    def requantizes(self) -> bool:
        return self.output_dtype != "int32"

    def multipliers(self, channels: int) -> np.ndarray:
        """m[o] per output channel, float32, computed in float32 as the class doc says."""
        sw = np.asarray(self.weight_scale, np.float32)
        if sw.size not in (1, channels):
            raise ValueError(f"weight_scale has {sw.size} values; give one, or one per output channel ({channels})")
        m = np.float32(self.input_scale[0]) * np.broadcast_to(sw, (channels,)).astype(np.float32)
        if self.output_dtype != "float32":
            m = m / np.float32(self.output_scale[0])
        if not np.isfinite(m).all() or (m <= 0).any():
            raise ValueError("the scales' product input_scale * weight_scale / output_scale overflows or underflows float32")
        return m.astype(np.float32)


def _scales(name: str, value, per_channel: bool) -> tuple:
    """Scales as a tuple of Python floats (one, or one per channel), finite and positive."""
    arr = np.asarray(value, dtype=np.float64) if not isinstance(value, (str, bytes)) else None
    # A scalar may come back as the 1-tuple this returns (dataclasses.replace re-checks).
    if arr is None or arr.ndim > 1 or arr.size == 0 or (not per_channel and arr.size != 1):
        shape = "a float or a sequence of floats (one per output channel)" if per_channel else "a float"
        raise TypeError(f"{name} must be {shape}, got {value!r}")
    flat = arr.reshape(-1)
    if not np.isfinite(flat).all() or (flat <= 0).any() or not np.isfinite(flat.astype(np.float32)).all():
        raise ValueError(f"{name} must be finite, positive float32 values (no NaN or inf), got {value!r}")
    return tuple(float(v) for v in flat)


def segments(ow: int, mr: int) -> list[tuple[int, int, int]]:
    """(first column, tiles, MR) runs covering one output row; no tile has MR = 1 unless ow = 1."""
    if ow == 1:
        return [(0, 1, 1)]
    full, rem = divmod(ow, mr)
    if rem == 1:
        # The last full tile and the lone column become two tiles of at least 2 each
        # (ow >= 2 and rem == 1 imply full >= 1).
        full -= 1
        a = (mr + 2) // 2
        tails = [a, mr + 1 - a]
    else:
        tails = [rem] if rem else []
    segs, col = [], 0
    if full:
        segs.append((0, full, mr))
        col = full * mr
    for t in tails:
        segs.append((col, 1, t))
        col += t
    return segs
