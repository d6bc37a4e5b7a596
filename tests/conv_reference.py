"""The plain conv2d every conv test checks against, written once: NCHW data, OIHW weights
(O, C/groups, KH, KW), zero padding, computed in the dtype it is given (float64 or int64)."""

import numpy as np


def pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def pads(padding):
    """int, (h, w) or (top, left, bottom, right) -> (top, left, bottom, right)."""
    if isinstance(padding, (tuple, list)) and len(padding) == 4:
        return tuple(padding)
    h, w = pair(padding)
    return h, w, h, w


def conv2d(x, w, stride=1, padding=0, dilation=1, groups=1):
    (sh, sw), (dh, dw) = pair(stride), pair(dilation)
    top, left, bottom, right = pads(padding)
    n = x.shape[0]
    o, cg, kh, kw = w.shape
    og = o // groups
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    oh = (xp.shape[2] - (kh - 1) * dh - 1) // sh + 1
    ow = (xp.shape[3] - (kw - 1) * dw - 1) // sw + 1
    out = np.zeros((n, o, oh, ow), np.result_type(x, w))
    for g in range(groups):
        xg = xp[:, g * cg:(g + 1) * cg]
        wg = w[g * og:(g + 1) * og]
        for r in range(kh):
            for s in range(kw):
                patch = xg[:, :, r * dh:r * dh + (oh - 1) * sh + 1:sh, s * dw:s * dw + (ow - 1) * sw + 1:sw]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, wg[:, :, r, s])
    return out


def qconv2d(x, w, zp_x, zp_w, stride=1, padding=0, dilation=1, groups=1):
    """int64 sum (x - zp_x) * (w - zp_w): zero points out first, then zero padding, so a padded
    pixel is the zero point and contributes nothing."""
    return conv2d(x.astype(np.int64) - zp_x, w.astype(np.int64) - zp_w, stride, padding, dilation, groups)


# float32 conv2d against the float64 reference

EPS = np.finfo(np.float32).eps


def ref_conv2d(x, w, stride=1, padding=0, dilation=1, groups=1):
    """Plain float64 conv2d: NCHW data, OIHW weights (O, C/groups, KH, KW)."""
    return conv2d(x.astype(np.float64), w.astype(np.float64), stride, padding, dilation, groups)


def assert_conv_close(got, x, w, **conv):
    """Compare a float32 conv2d against the float64 reference, with a bound from its reduction.

    Every output is a dot product of length K = C/groups * KH * KW (zero padding, of the image
    or of the blocked channels, adds exact zeros: an FMA with a zero product does not round).
    As for GEMM in conftest.f32_tolerance: the K FMAs plus the initial zero are K+1 terms, each
    rounding costs at most u = eps/2 relative to the running magnitude, so
    |error| <= (K+1) * u * sum|x||w|; we allow eps (2u) per term, plus `tiny` for underflow.
    sum|x||w| is the same convolution on |x| and |w|.
    """
    ref = ref_conv2d(x, w, **conv)
    assert got.shape == ref.shape, f"shape {got.shape}, expected {ref.shape}"
    assert got.dtype == np.float32
    k = w.shape[1] * w.shape[2] * w.shape[3]
    tol = (k + 1) * EPS * ref_conv2d(np.abs(x), np.abs(w), **conv) + np.finfo(np.float32).tiny
    err = np.abs(got - ref)
    bad = err > tol
    assert not bad.any(), (f"{bad.sum()} of {bad.size} elements off; worst error {err.max():.3g} "
                           f"vs its bound {tol.flat[np.argmax(err)]:.3g}")


def with_post_ops(x, w, b, r, post, **conv):
    """The float64 reference with a PostOps value applied after it, as the unfused ops would."""
    ref = ref_conv2d(x, w, **conv)
    if post.bias:
        ref = ref + b[None, :, None, None]
    if post.residual:
        ref = ref + r
    if post.activation == "relu":
        ref = np.maximum(ref, 0)
    elif post.activation == "clip":
        ref = np.clip(ref, *post.clip)
    return ref
