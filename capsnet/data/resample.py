"""Exact resampling: bilinear warps about the centre and antialiased resizing, the same
bytes on every CPU and torch kernel.

torch's grid_sample, affine_grid, interpolate and matrix products take different code
paths on AVX-512, AVX2 and scalar CPUs (vector widths, fused multiply-adds, reordered
sums), and libm's sin and cos differ between builds, so their float results, and the uint8
images rounded from them, change with the machine. Here every value comes from elementwise
float64 operations (+, -, *, /, floor, comparisons) applied in a fixed order, never fused
or reordered into a reduction; IEEE 754 rounds each of them the same way at any SIMD
width. Sines and cosines come from a fixed polynomial. Images are rounded to uint8 once,
at the end (half up).
"""

from __future__ import annotations

import math

import torch

from capsnet.io.errors import DataError

F64 = torch.float64
_SIN = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(10))  # x^1 .. x^19
_COS = tuple((-1) ** k / math.factorial(2 * k) for k in range(10))  # x^0 .. x^18


def sin_cos_degrees(degrees: float) -> tuple[float, float]:
    """(sin, cos) of ``degrees`` from Python float arithmetic alone: exact at multiples of
    90 degrees, within a few 1e-16 elsewhere, and the same bits on every machine."""
    degrees = float(degrees)
    if not math.isfinite(degrees):
        raise DataError(f"rotation angle {degrees} is not a finite number of degrees")
    quarter = round(degrees / 90.0)
    x = (degrees - 90.0 * quarter) * (math.pi / 180.0)  # |x| <= pi/4 radians
    x2 = x * x
    sin, cos = 0.0, 0.0
    for coefficient in reversed(_SIN):  # Horner, highest power first
        sin = sin * x2 + coefficient
    for coefficient in reversed(_COS):
        cos = cos * x2 + coefficient
    sin = sin * x
    return ((sin, cos), (cos, -sin), (-sin, -cos), (-cos, sin))[quarter % 4]


def _check_uint8(images: torch.Tensor, dims: int) -> None:
    if images.dtype != torch.uint8 or images.dim() != dims:
        raise DataError(
            f"resampling needs uint8 images with {dims} dims, got "
            f"{images.dtype} {tuple(images.shape)}"
        )


def sample_bilinear(images: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """Bilinear samples of images uint8 (N, C, H, W) at source pixel coordinates xs, ys
    float64 (N or 1, P) (column, row of pixel centres); zero outside. -> uint8 (N, C, P).

    The image gets a border of zeros and the coordinates are clamped into it, so a
    neighbour off the image reads 0 and one past the border has weight 0.
    """
    _check_uint8(images, 4)
    n, c, h, w = images.shape
    padded = torch.nn.functional.pad(images, (1, 1, 1, 1)).reshape(n, c, -1).to(F64)
    xs, ys = xs.clamp(-1, w), ys.clamp(-1, h)  # (N|1, P) inside the border
    x0, y0 = xs.floor(), ys.floor()  # (N|1, P)
    fx, fy = xs - x0, ys - y0  # (N|1, P) in [0, 1)
    corner = (y0 + 1) * (w + 2) + (x0 + 1)  # (N|1, P) top-left neighbour in the padded image
    last = padded.shape[-1] - 1
    total = None
    for step, weight in (
        (0, (1.0 - fy) * (1.0 - fx)),
        (1, (1.0 - fy) * fx),
        (w + 2, fy * (1.0 - fx)),
        (w + 3, fy * fx),
    ):
        index = (corner + step).clamp_(max=last).long()  # (N|1, P)
        pixels = padded.gather(2, index[:, None].expand(n, c, -1))  # (N, C, P)
        term = weight[:, None] * pixels  # (N, C, P)
        total = term if total is None else total + term
    return (total + 0.5).floor_().clamp_(0, 255).to(torch.uint8)  # (N, C, P)


def warp_about_centre(
    images: torch.Tensor,
    inverse: torch.Tensor,
    shift: torch.Tensor | None = None,
    batch: int = 256,
) -> torch.Tensor:
    """Affine warp of images uint8 (N, C, H, W) about the canvas centre, bilinear, zero fill,
    same canvas, ``batch`` images at a time (small batches stay in the CPU's caches).
    -> uint8 (N, C, H, W).

    ``inverse`` float64 (N or 1, 2, 2) maps an output pixel's (x, y) offset from the centre
    (x to the right, y down) to its source offset; ``shift`` float64 (N or 1, 2) moves the
    output by (x, y) pixels after the map.
    """
    _check_uint8(images, 4)
    n, c, h, w = images.shape
    inverse = inverse.to(F64)
    shift = torch.zeros(1, 2, dtype=F64) if shift is None else shift.to(F64)
    cx, cy = (w - 1) / 2, (h - 1) / 2
    x = (torch.arange(w, dtype=F64) - cx).repeat(h)[None]  # (1, H*W) row-major
    y = (torch.arange(h, dtype=F64) - cy).repeat_interleave(w)[None]  # (1, H*W)
    out = []
    for start in range(0, n, batch):
        m, offset = (t if t.shape[0] == 1 else t[start : start + batch] for t in (inverse, shift))
        dx, dy = x - offset[:, :1], y - offset[:, 1:]  # (B|1, H*W)
        xs = m[:, 0, :1] * dx + m[:, 0, 1:] * dy + cx  # (B|1, H*W) source columns
        ys = m[:, 1, :1] * dx + m[:, 1, 1:] * dy + cy  # (B|1, H*W) source rows
        out.append(sample_bilinear(images[start : start + batch], xs, ys))  # (B, C, H*W)
    if not out:
        return images.clone()
    return torch.cat(out).view(n, c, h, w)  # (N, C, H, W)


def rotate(images: torch.Tensor, angle: float) -> torch.Tensor:
    """Rotate uint8 images (N, [C,] H, W) about their centre by ``angle`` degrees, counter-
    clockwise as displayed; bilinear, zero fill, same canvas, same shape out."""
    sin, cos = sin_cos_degrees(angle)
    inverse = torch.tensor([[[cos, -sin], [sin, cos]]], dtype=F64)  # (1, 2, 2)
    h, w = images.shape[-2:]
    flat = images.reshape(-1, 1, h, w)  # (N*C, 1, H, W)
    return warp_about_centre(flat, inverse).view(images.shape)


def _taps(size_in: int, size_out: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Source indices int64 (size_out, K) and weights float64 (size_out, K) of a triangle
    (bilinear) filter widened to the scale when shrinking, as antialiased resizing does;
    short rows are padded with weight 0."""
    scale = size_in / size_out
    support = max(scale, 1.0)
    rows = []
    for i in range(size_out):
        centre = (i + 0.5) * scale
        lo = max(int(centre - support + 0.5), 0)
        hi = min(int(centre + support + 0.5), size_in)
        weights = [max(0.0, 1.0 - abs((j + 0.5 - centre) / support)) for j in range(lo, hi)]
        total = 0.0
        for weight in weights:
            total = total + weight
        rows.append([(j, weight / total) for j, weight in zip(range(lo, hi), weights)])
    k = max(len(row) for row in rows)
    index = torch.tensor([[j for j, _ in row] + [0] * (k - len(row)) for row in rows])
    weight = torch.tensor([[v for _, v in row] + [0.0] * (k - len(row)) for row in rows], dtype=F64)
    return index, weight  # (size_out, K) each


def _filter(values: torch.Tensor, dim: int, index: torch.Tensor, weight: torch.Tensor):
    """Weighted sum of ``values`` float64 (..., H, W) along ``dim`` (-2 or -1), tap by tap
    in order, with ``index``, ``weight`` (size, K) from ``_taps``."""
    total = None
    axis = values.dim() + dim
    for k in range(index.shape[1]):
        taps = values.index_select(axis, index[:, k])  # (..., size, W) or (..., H, size)
        term = (weight[:, k, None] if dim == -2 else weight[:, k]) * taps
        total = term if total is None else total + term
    return total


def resize(images: torch.Tensor, size: int, chunk: int = 16) -> torch.Tensor:
    """uint8 (N, C, H, W) -> uint8 (N, C, size, size), antialiased bilinear (rows, then
    columns, in float64), rounded once; ``chunk`` images at a time (small chunks stay in the
    CPU's caches: 512 96x96 stereo pairs took three times as long)."""
    _check_uint8(images, 4)
    n, c, h, w = images.shape
    rows, cols = _taps(h, size), _taps(w, size)
    out = images.new_empty(n, c, size, size)
    for start in range(0, n, chunk):
        part = images[start : start + chunk].to(F64)  # (B, C, H, W)
        part = _filter(part, -2, *rows)  # (B, C, size, W)
        part = _filter(part, -1, *cols)  # (B, C, size, size)
        out[start : start + chunk] = (part + 0.5).floor_().clamp_(0, 255).to(torch.uint8)
    return out
