"""smallnorb-synth: a smallNORB stand-in rendered here, written as the six official files.

Five classes of toy solids (animal, human, airplane, truck, car: unions of ellipsoids and
boxes, a distinct layout per class), ten instances per class (training instances 4, 6, 7,
8, 9 and test instances 0, 1, 2, 3, 5, as the official split) that differ in part sizes,
overall scale, a yaw offset and part brightness. Each instance is rendered on the official
grid, 9 elevations (30..70 degrees) x 18 azimuths (0..340) x 6 lightings, as a stereo pair
of 96x96 uint8 images (two orthographic cameras 2 x ``STEREO_DEGREES`` apart in azimuth),
Lambertian shading under a light that each lighting index places elsewhere.

Rows are written in a fixed scrambled order (row r holds table entry r * STRIDE mod N of
the (class, instance, elevation, azimuth, lighting) table), so a tail held out for
validation covers every class and view. The bytes are the same on every CPU: every value
is an elementwise float64 operation (+, -, *, /, sqrt, comparisons), sines and cosines
come from ``capsnet.data.resample.sin_cos_degrees``, and pixels are rounded once.

It is a stand-in: it exercises the smallNORB files, preparation, every stage and the EM
model on a 5-class 3D task with viewpoint and lighting changes, and it says nothing about
accuracy on the real smallNORB.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch

from capsnet.data.resample import sin_cos_degrees

F64 = torch.float64
SIDE = 96
ELEVATIONS = 9  # index e: 30 + 5 e degrees
AZIMUTHS = tuple(range(0, 36, 2))  # info value a: 10 a degrees
LIGHTINGS = 6
PARTS_OF_SPLIT = ("dat", "cat", "info")
INSTANCES = {"train": (4, 6, 7, 8, 9), "test": (0, 1, 2, 3, 5)}
STEREO_DEGREES = 2.5  # each camera's azimuth offset from the view's
EXTENT = 1.3  # the image spans [-EXTENT, EXTENT] in both axes (object units)
STRIDE = 7919  # coprime with 24,300: the row scramble is a bijection
MANIFEST = "MD5SUMS"  # raw MD5 of each rendered file, beside them
# Raw (decompressed) MD5 of the six files at seed 0, side 96: any x86 CPU renders these bytes.
RECORDED_MD5 = {
    ("train", "dat"): "ad0d12a32229274a4402681019f415e1",
    ("train", "cat"): "036821820a176af982f23a8c9d5c819f",
    ("train", "info"): "1ec82fd93cf72e0cd8356841deb83eea",
    ("test", "dat"): "ccf5b28799f22aaa36473fb0fabcc8bb",
    ("test", "cat"): "036821820a176af982f23a8c9d5c819f",
    ("test", "info"): "1e63458ba6e137dd3f9783d429346189",
}
NOTE = "smallnorb-synth: rendered stand-in for smallNORB (toy solids), not the real data"

# Per class: (kind, centre (x, y, z), half sizes (x, y, z)); y is up, x the long axis.
PARTS: tuple[tuple[tuple[str, tuple[float, ...], tuple[float, ...]], ...], ...] = (
    (  # animal: body, head, four legs
        ("ellipsoid", (0.0, 0.05, 0.0), (0.65, 0.28, 0.26)),
        ("ellipsoid", (0.72, 0.38, 0.0), (0.2, 0.18, 0.16)),
        ("box", (0.42, -0.45, 0.16), (0.06, 0.3, 0.06)),
        ("box", (0.42, -0.45, -0.16), (0.06, 0.3, 0.06)),
        ("box", (-0.42, -0.45, 0.16), (0.06, 0.3, 0.06)),
        ("box", (-0.42, -0.45, -0.16), (0.06, 0.3, 0.06)),
    ),
    (  # human: torso, head, two legs, arms
        ("ellipsoid", (0.0, 0.15, 0.0), (0.24, 0.4, 0.14)),
        ("ellipsoid", (0.0, 0.75, 0.0), (0.15, 0.17, 0.15)),
        ("box", (0.0, -0.6, 0.1), (0.08, 0.38, 0.08)),
        ("box", (0.0, -0.6, -0.1), (0.08, 0.38, 0.08)),
        ("box", (0.0, 0.2, 0.0), (0.06, 0.06, 0.45)),
    ),
    (  # airplane: fuselage, wings, fin, tailplane
        ("ellipsoid", (0.0, 0.0, 0.0), (0.95, 0.14, 0.14)),
        ("box", (0.05, 0.0, 0.0), (0.22, 0.03, 0.9)),
        ("box", (-0.78, 0.22, 0.0), (0.13, 0.22, 0.03)),
        ("box", (-0.8, 0.04, 0.0), (0.1, 0.025, 0.32)),
    ),
    (  # truck: cab, cargo box, chassis
        ("box", (0.62, -0.08, 0.0), (0.22, 0.3, 0.3)),
        ("box", (-0.22, 0.08, 0.0), (0.58, 0.42, 0.33)),
        ("box", (0.0, -0.42, 0.0), (0.85, 0.08, 0.28)),
    ),
    (  # car: low body, rounded cabin, bonnet bump
        ("box", (0.0, -0.22, 0.0), (0.85, 0.17, 0.36)),
        ("ellipsoid", (-0.08, 0.02, 0.0), (0.48, 0.24, 0.32)),
        ("ellipsoid", (0.55, -0.05, 0.0), (0.3, 0.08, 0.3)),
    ),
)
# Per lighting index: (light azimuth, light elevation) in degrees, ambient, diffuse, background.
LIGHTS = (
    (-50.0, 40.0, 0.20, 0.80, 0.20),
    (-15.0, 65.0, 0.25, 0.75, 0.24),
    (20.0, 35.0, 0.15, 0.85, 0.18),
    (60.0, 55.0, 0.30, 0.70, 0.28),
    (120.0, 45.0, 0.22, 0.70, 0.22),
    (180.0, 75.0, 0.35, 0.60, 0.30),
)


def _unit(azimuth: float, elevation: float) -> tuple[float, float, float]:
    """The direction (x, y, z) at ``azimuth`` about y (from +z towards +x) and
    ``elevation`` above the x-z plane, in degrees."""
    sin_a, cos_a = sin_cos_degrees(azimuth)
    sin_e, cos_e = sin_cos_degrees(elevation)
    return (cos_e * sin_a, sin_e, cos_e * cos_a)


def _instance(category: int, instance: int, seed: int):
    """(parts scaled for this instance, albedo per part, yaw degrees) from a generator
    seeded by (seed, category, instance)."""
    generator = torch.Generator().manual_seed(seed * 1000 + category * 10 + instance)
    parts = PARTS[category]
    draws = torch.rand(len(parts) * 4 + 2, generator=generator, dtype=F64).tolist()
    scale = 0.85 + 0.25 * draws[0]
    yaw = -15.0 + 30.0 * draws[1]
    shaped = []
    albedo = []
    for k, (kind, centre, half) in enumerate(parts):
        stretch = [0.8 + 0.4 * draws[2 + 4 * k + axis] for axis in range(3)]
        sized = tuple(h * s * scale for h, s in zip(half, stretch))
        shaped.append((kind, tuple(c * scale for c in centre), sized))
        albedo.append(0.55 + 0.4 * draws[5 + 4 * k])
    return shaped, albedo, yaw


def _cameras(yaw: float, elevation_degrees: float):
    """Per camera view (azimuth-major, then the stereo pair): the right, up and towards-camera
    unit vectors in the object's frame, float64 (V, 1) each, V = 18 x 2."""
    rows = []
    for azimuth in AZIMUTHS:
        for side in (-1.0, 1.0):
            phi = 10.0 * azimuth - yaw + side * STEREO_DEGREES
            sin_p, cos_p = sin_cos_degrees(phi)
            sin_t, cos_t = sin_cos_degrees(elevation_degrees)
            towards = (cos_t * sin_p, sin_t, cos_t * cos_p)
            right = (cos_p, 0.0, -sin_p)
            up = (-sin_t * sin_p, cos_t, -sin_t * cos_p)
            rows.append(right + up + towards)
    table = torch.tensor(rows, dtype=F64)  # (V, 9)
    return [table[:, k : k + 1] for k in range(9)]  # 9 x (V, 1)


def _pixel_grid(side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Image-plane coordinates u (right), v (up) of the pixel centres, float64 (1, side^2)."""
    step = 2.0 * EXTENT / side
    centres = (torch.arange(side, dtype=F64) + 0.5) * step - EXTENT  # (side,)
    u = centres.repeat(side)  # column coordinate, row-major pixels
    v = (-centres).repeat_interleave(side)  # row 0 at the top
    return u[None], v[None]


def _hit_ellipsoid(origin, direction, centre, half):
    """(t, normal x, y, z) of orthographic rays against an axis-aligned ellipsoid; t = inf
    where they miss. ``origin``, ``direction``: 3 x (K,), one entry per ray."""
    p = [(o - c) / h for o, c, h in zip(origin, centre, half)]  # 3 x (K,) unit-sphere frame
    q = [d / h for d, h in zip(direction, half)]  # 3 x (K,)
    a = q[0] * q[0] + q[1] * q[1] + q[2] * q[2]  # (K,)
    b = p[0] * q[0] + p[1] * q[1] + p[2] * q[2]
    c = p[0] * p[0] + p[1] * p[1] + p[2] * p[2] - 1.0
    disc = b * b - a * c
    t = (-b - disc.clamp(min=0.0).sqrt()) / a  # (K,) nearer root
    t = torch.where(disc >= 0.0, t, torch.inf)
    normal = [(pk + t.clamp(max=1e6) * qk) / h for pk, qk, h in zip(p, q, half)]  # 3 x (K,)
    length = (normal[0] * normal[0] + normal[1] * normal[1] + normal[2] * normal[2]).sqrt()
    length = length.clamp(min=1e-12)
    return t, [n / length for n in normal]


def _hit_box(origin, direction, centre, half):
    """(t, normal x, y, z) of orthographic rays against an axis-aligned box (slab test)."""
    near, far, axis_near = None, None, []
    for o, d, c, h in zip(origin, direction, centre, half):
        d = torch.where(d.abs() < 1e-12, 1e-12, d)  # (K,) no division by zero
        t1, t2 = (c - h - o) / d, (c + h - o) / d  # (K,)
        low, high = torch.minimum(t1, t2), torch.maximum(t1, t2)
        axis_near.append(low)
        near = low if near is None else torch.maximum(near, low)
        far = high if far is None else torch.minimum(far, high)
    t = torch.where(near <= far, near, torch.inf)  # (K,)
    normal, taken = [], torch.zeros_like(t, dtype=torch.bool)
    for low, d in zip(axis_near, direction):
        face = (low == near) & ~taken  # the first axis whose slab the ray entered last
        taken = taken | face
        normal.append(torch.where(face, -torch.sign(d), 0.0))  # (K,)
    return t, normal


def _near(columns, rows, right, up, kind: str, centre, half) -> torch.Tensor:
    """Flat indices (view * P + pixel), (K,), of the rays that pass within the part's
    bounding sphere (with a margin); every other ray misses the part (t = inf).
    ``columns``, ``rows``: the pixel centres' u and v, (side,) each; ``right``, ``up``: the
    cameras' axes, 3 x (V, 1)."""
    radius = max(half) if kind == "ellipsoid" else math.sqrt(sum(h * h for h in half))
    cu = centre[0] * right[0] + centre[1] * right[1] + centre[2] * right[2]  # (V, 1)
    cv = centre[0] * up[0] + centre[1] * up[1] + centre[2] * up[2]  # the centre's projection
    du, dv = (columns - cu) ** 2, (rows - cv) ** 2  # (V, side) each
    inside = dv[:, :, None] + du[:, None, :] <= (radius + 1e-6) ** 2  # (V, side, side)
    return inside.view(-1).nonzero().view(-1)


def _render_elevation(
    parts, albedo, yaw: float, elevation: int, side: int, lightings: int = LIGHTINGS
) -> torch.Tensor:
    """uint8 (lightings, 18, 2, side, side): one instance at one elevation index, under the
    first ``lightings`` lights. A part is traced only for the rays near it (``_near``) and
    a pixel shaded only where seen: each pixel gets the arithmetic of the whole grid."""
    cameras = [c[:, 0] for c in _cameras(yaw, 30.0 + 5.0 * elevation)]  # 9 x (V,)
    right, up = cameras[0:3], cameras[3:6]  # cameras[6:9]: towards the camera
    u, v = _pixel_grid(side)  # (1, P)
    u, v = u[0], v[0]  # (P,)
    pixels = u.shape[0]
    best = torch.full((len(cameras[0]) * pixels,), torch.inf, dtype=F64)  # (V P,)
    nx, ny, nz, shade = (torch.zeros_like(best) for _ in range(4))
    for (kind, centre, half), part_albedo in zip(parts, albedo):
        hit = _hit_ellipsoid if kind == "ellipsoid" else _hit_box
        axes = [a[:, None] for a in (*right, *up)]  # 6 x (V, 1)
        index = _near(u[:side], v[::side], axes[:3], axes[3:], kind, centre, half)  # (K,)
        view, pixel = index // pixels, index % pixels  # (K,) each
        pu, pv = u.index_select(0, pixel), v.index_select(0, pixel)  # (K,) each
        at_view = [c.index_select(0, view) for c in cameras]  # 9 x (K,)
        origin = [
            pu * r + pv * w + 3.0 * t for r, w, t in zip(at_view[0:3], at_view[3:6], at_view[6:9])
        ]  # 3 x (K,)
        t, normal = hit(origin, [-c for c in at_view[6:9]], centre, half)  # (K,), 3 x (K,)
        previous = best.index_select(0, index)  # (K,)
        closer = t < previous  # (K,)
        index = index[closer]  # (K',) the rays this part is the nearest hit of so far
        best.index_copy_(0, index, t[closer])
        for n, h in zip((nx, ny, nz), normal):
            n.index_copy_(0, index, h[closer])
        shade.index_fill_(0, index, part_albedo)
    seen = (best < torch.inf).nonzero().view(-1)  # (S,) flat indices of the rays that hit
    sx, sy, sz, albedo_seen = (a.index_select(0, seen) for a in (nx, ny, nz, shade))  # (S,)
    images = []
    for light_azimuth, light_elevation, ambient, diffuse, background in LIGHTS[:lightings]:
        lx, ly, lz = _unit(light_azimuth - yaw, light_elevation)  # into the object's frame
        lambert = (sx * lx + sy * ly + sz * lz).clamp(min=0.0)  # (S,)
        value = albedo_seen * (ambient + diffuse * lambert)  # (S,)
        image = _to_uint8(torch.tensor(background, dtype=F64)).expand(best.shape).clone()
        image.index_copy_(0, seen, _to_uint8(value))  # (V P,)
        images.append(image)
    return torch.stack(images).view(lightings, len(AZIMUTHS), 2, side, side)


def _to_uint8(value: torch.Tensor) -> torch.Tensor:
    """Shaded values in [0, 1] (float64) -> rounded uint8 pixels."""
    return (value * 255.0 + 0.5).floor().clamp(0, 255).to(torch.uint8)


def render_split(split: str, seed: int = 0, side: int = SIDE, lightings: int = LIGHTINGS):
    """(dat uint8 (N, 2, side, side), cat int32 (N,), info int32 (N, 4)) of ``split`` in the
    official row layout, N = 5 x 5 x 9 x 18 x 6 = 24,300 (scrambled order, see the module);
    ``lightings`` below 6 keeps the first lighting indices only (N = 4,050 per lighting)."""
    instances = INSTANCES[split]
    count = len(PARTS) * len(instances) * ELEVATIONS * len(AZIMUTHS) * lightings
    table = torch.empty(count, 2, side, side, dtype=torch.uint8)  # sorted (c, i, e, a, l)
    info = torch.empty(count, 4, dtype=torch.int32)
    cat = torch.empty(count, dtype=torch.int32)
    block = len(AZIMUTHS) * lightings
    row = 0
    for category in range(len(PARTS)):
        for instance in instances:
            parts, albedo, yaw = _instance(category, instance, seed)
            for elevation in range(ELEVATIONS):
                views = _render_elevation(parts, albedo, yaw, elevation, side, lightings)
                # views: (L, A, 2, S, S)
                table[row : row + block] = views.transpose(0, 1).reshape(block, 2, side, side)
                grid = torch.cartesian_prod(torch.arange(len(AZIMUTHS)), torch.arange(lightings))
                info[row : row + block, 0] = instance
                info[row : row + block, 1] = elevation
                info[row : row + block, 2] = torch.tensor(AZIMUTHS)[grid[:, 0]].int()
                info[row : row + block, 3] = grid[:, 1].int()
                cat[row : row + block] = category
                row += block
    order = torch.arange(count, dtype=torch.int64) * STRIDE % count  # (N,) a bijection
    return table.index_select(0, order), cat[order], info[order]


def write_raw(
    out_dir: str | os.PathLike, seed: int = 0, side: int = SIDE, lightings: int = LIGHTINGS
) -> list[Path]:
    """Render both splits and write the six official files (gzipped) into ``out_dir``."""
    from capsnet.data.formats import write_norb
    from capsnet.data.smallnorb import PREFIX, filename

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for split in PREFIX:
        dat, cat, info = render_split(split, seed, side, lightings)
        for part, array in zip(PARTS_OF_SPLIT, (dat, cat, info)):
            path = out_dir / filename(split, part)
            write_norb(path, np.ascontiguousarray(array.numpy()))
            written.append(path)
    return written


def _read_manifest(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    pairs = (line.split("  ", 1) for line in path.read_text().splitlines() if "  " in line)
    return {name: digest for digest, name in pairs}


def obtain(
    out_dir: str | os.PathLike, seed: int = 0, side: int = SIDE, lightings: int = LIGHTINGS
) -> list[Path]:
    """The six files in ``out_dir``: kept when they match its MD5SUMS manifest for this
    seed, side and lightings, otherwise rendered and checked (at seed 0, side 96, against
    RECORDED_MD5: a DataError when this machine rendered other bytes) and the manifest
    written (``md5sum -c`` reads it)."""
    from capsnet.data.smallnorb import PREFIX, filename
    from capsnet.data.sources import is_verified, raw_md5
    from capsnet.io.errors import DataError
    from capsnet.io.files import atomic_write_bytes

    out_dir = Path(out_dir)
    names = {(split, part): filename(split, part) for split in PREFIX for part in PARTS_OF_SPLIT}
    manifest = _read_manifest(out_dir / MANIFEST)
    settings = f"# smallnorb-synth seed {seed} side {side}"
    if lightings != LIGHTINGS:
        settings += f" lightings {lightings}"
    header_ok = (out_dir / MANIFEST).is_file() and settings in (out_dir / MANIFEST).read_text()
    if header_ok and all(
        name in manifest and is_verified(out_dir / name, manifest[name]) for name in names.values()
    ):
        return [out_dir / name for name in names.values()]
    write_raw(out_dir, seed, side, lightings)
    digests = {key: raw_md5(out_dir / name) for key, name in names.items()}
    if (seed, side, lightings) == (0, SIDE, LIGHTINGS):
        for key, digest in digests.items():
            if digest != RECORDED_MD5[key]:
                raise DataError(
                    f"{out_dir / names[key]}: rendered content has MD5 {digest}, recorded "
                    f"{RECORDED_MD5[key]}: this machine renders smallnorb-synth differently"
                )
    lines = [settings] + [f"{digests[key]}  {name}" for key, name in names.items()]
    atomic_write_bytes(out_dir / MANIFEST, ("\n".join(lines) + "\n").encode())
    return [out_dir / name for name in names.values()]
