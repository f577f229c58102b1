"""The Triton kernel of batch_resize.py (its docstring gives the arithmetic): one program per BLOCK output pixels of
one batch entry, all three channels, the weights of both dimensions computed in place."""

import triton
import triton.language as tl

BLOCK = 256  # output pixels per program


@triton.jit
def resize(pixels, meta, geometry, out, size, BLOCK: tl.constexpr):
    """pixels: every decoded image (uint8 3 x H x W) one after another; meta: int64 per entry (start in pixels, H,
    W, region top, left, height, width, flip); geometry: float32 per entry (scale y, x, shift y, x); out: uint8
    entries x size x size x 3. Each entry's program visits only the input pixels its own scale can reach (2 x
    support + 1, at most), so one large photo does not widen every other entry's loops."""
    entry = tl.program_id(0).to(tl.int64)  # the output's offsets pass 2**31 at 14,267 entries of 224 px
    at = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = at < size * size
    row = meta + entry * 8
    start, height, width = tl.load(row), tl.load(row + 1), tl.load(row + 2)
    top, left, flip = tl.load(row + 3), tl.load(row + 4), tl.load(row + 7)
    region_h, region_w = tl.load(row + 5), tl.load(row + 6)
    scale_y, scale_x = tl.load(geometry + entry * 4), tl.load(geometry + entry * 4 + 1)
    shift_y, shift_x = tl.load(geometry + entry * 4 + 2), tl.load(geometry + entry * 4 + 3)

    out_y = at // size
    out_x = at % size
    out_x = tl.where(flip != 0, size - 1 - out_x, out_x)  # a mirrored entry's pixel x comes from the region's size-1-x
    centre_y = scale_y * (out_y.to(tl.float32) + shift_y + 0.5)
    centre_x = scale_x * (out_x.to(tl.float32) + shift_x + 0.5)
    support_y, support_x = tl.maximum(scale_y, 1.0), tl.maximum(scale_x, 1.0)
    taps_y, taps_x = (2.0 * support_y).to(tl.int32) + 2, (2.0 * support_x).to(tl.int32) + 2
    first_y = tl.maximum((centre_y - support_y + 0.5).to(tl.int64), 0)  # truncated, as torch's int() is
    first_x = tl.maximum((centre_x - support_x + 0.5).to(tl.int64), 0)
    end_y = tl.minimum((centre_y + support_y + 0.5).to(tl.int64), region_h)
    end_x = tl.minimum((centre_x + support_x + 0.5).to(tl.int64), region_w)

    plane = height * width
    red = tl.zeros([BLOCK], dtype=tl.float32)
    green = tl.zeros([BLOCK], dtype=tl.float32)
    blue = tl.zeros([BLOCK], dtype=tl.float32)
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for ky in range(0, taps_y):
        y = first_y + ky
        weight_y = tl.maximum(1.0 - tl.abs((y.to(tl.float32) - centre_y + 0.5) / support_y), 0.0)
        weight_y = tl.where(y < end_y, weight_y, 0.0)
        for kx in range(0, taps_x):
            x = first_x + kx
            weight_x = tl.maximum(1.0 - tl.abs((x.to(tl.float32) - centre_x + 0.5) / support_x), 0.0)
            weight = weight_y * tl.where(x < end_x, weight_x, 0.0)
            read = inside & (weight > 0.0)
            at_pixel = start + (top + y) * width + (left + x)
            red += weight * tl.load(pixels + at_pixel, mask=read, other=0).to(tl.float32)
            green += weight * tl.load(pixels + at_pixel + plane, mask=read, other=0).to(tl.float32)
            blue += weight * tl.load(pixels + at_pixel + 2 * plane, mask=read, other=0).to(tl.float32)
            total += weight

    total = tl.where(total > 0.0, total, 1.0)
    target = out + (entry * size * size + at) * 3
    tl.store(target, level(red, total), mask=inside)
    tl.store(target + 1, level(green, total), mask=inside)
    tl.store(target + 2, level(blue, total), mask=inside)


@triton.jit
def level(value, total):
    """A weighted sum as a uint8 level: normalised by the weights' total, rounded half up, clamped."""
    return tl.minimum(tl.maximum(tl.floor(value / total + 0.5), 0.0), 255.0).to(tl.uint8)
