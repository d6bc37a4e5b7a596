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
