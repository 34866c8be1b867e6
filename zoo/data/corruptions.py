"""Image corruptions at five severities, generated offline and deterministically: the shift suites the seed papers
evaluate on (CIFAR-10-C of Hendrycks & Dietterich 2019; MNIST-C-style shifts of the test images of any image set).

Fourteen corruptions without weather (no snow, frost, fog, spatter, which need photographs or colour): Gaussian,
shot, impulse and speckle noise; Gaussian, glass, defocus, motion and zoom blur; contrast, brightness, elastic
transform, pixelate and JPEG compression. Each takes images ``[N, H, W, C]`` in ``[0, 1]`` and returns the same
shape. The severity parameters are CIFAR-10-C's published ones, given for 32-pixel images; spatial parameters (blur
radii and sigmas, elastic displacements) scale with the image side, so a 28-pixel MNIST digit and an 8-pixel
scikit-learn digit are damaged alike in relative terms.

Why not the ``imagecorruptions`` package: its last release (1.1.2, 2020) refuses images under 32 pixels and fails
on current scikit-image and NumPy 2 (glass and Gaussian blur, fog). The primitives here are SciPy's (filters,
affine and coordinate maps) and Pillow's (JPEG, box resampling); the random draws come from one NumPy generator
per (seed, corruption, severity), so a suite is the same on every machine and in every process.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
from scipy import ndimage

from zoo.errors import ZooInputError

Corruption = Callable[[np.ndarray, int, np.random.Generator], np.ndarray]
SEVERITIES = (1, 2, 3, 4, 5)
REFERENCE_SIDE = 32  # the image side CIFAR-10-C's spatial parameters were chosen for
CORRUPTION_STREAM = 104729  # mixed into every corruption's seed, apart from any loader's own stream


def _spatial(images: np.ndarray) -> float:
    """How much larger than a CIFAR image these images are (spatial parameters scale by it)."""
    return images.shape[1] / REFERENCE_SIDE


def _each_channel(images: np.ndarray, per_image: Callable[[np.ndarray, int], np.ndarray]) -> np.ndarray:
    """Apply ``per_image(plane [H, W], image index)`` to every channel of every image."""
    out = np.empty_like(images)
    for i in range(images.shape[0]):
        for c in range(images.shape[3]):
            out[i, :, :, c] = per_image(images[i, :, :, c], i)
    return out


# ---------------------------------------------------------------------------------------------------- noise
def gaussian_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Additive Gaussian noise of standard deviation 0.04 .. 0.10."""
    sd = (0.04, 0.06, 0.08, 0.09, 0.10)[severity - 1]
    return x + rng.normal(0.0, sd, size=x.shape)


def shot_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Poisson (photon) noise: ``Poisson(x * rate) / rate`` with rate 500 .. 50 photons at full intensity."""
    rate = (500, 250, 100, 75, 50)[severity - 1]
    return rng.poisson(np.clip(x, 0.0, 1.0) * rate) / rate


def impulse_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Salt-and-pepper noise: a share 0.01 .. 0.07 of the values set to 0 or 1, half each."""
    amount = (0.01, 0.02, 0.03, 0.05, 0.07)[severity - 1]
    hit = rng.random(x.shape) < amount
    salt = rng.random(x.shape) < 0.5
    return np.where(hit, salt.astype(x.dtype), x)


def speckle_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Multiplicative Gaussian noise ``x (1 + e)``, e of standard deviation 0.06 .. 0.20."""
    sd = (0.06, 0.10, 0.12, 0.16, 0.20)[severity - 1]
    return x + x * rng.normal(0.0, sd, size=x.shape)


# ---------------------------------------------------------------------------------------------------- blur
def gaussian_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Gaussian blur of sigma 0.4 .. 1.0 pixels (at 32 pixels)."""
    sigma = (0.4, 0.6, 0.7, 0.8, 1.0)[severity - 1] * _spatial(x)
    return ndimage.gaussian_filter(x, sigma=(0, sigma, sigma, 0), mode="nearest")


def glass_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Blur, swap every pixel with a random neighbour up to ``delta`` away (1-2 sweeps), blur again."""
    sigma, delta, sweeps = ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2))[severity - 1]
    sigma *= _spatial(x)
    delta = max(1, int(round(delta * _spatial(x))))
    out = ndimage.gaussian_filter(x, sigma=(0, sigma, sigma, 0), mode="nearest")
    n, h, w = x.shape[:3]
    every = np.arange(n)
    for _ in range(sweeps):
        for r in range(h - delta - 1, delta - 1, -1):  # the same bottom-up scan for all images at once
            for c in range(w - delta - 1, delta - 1, -1):
                dr, dc = rng.integers(-delta, delta, size=(2, n))
                rr, cc = r + dr, c + dc
                here, there = out[every, r, c].copy(), out[every, rr, cc].copy()
                out[every, r, c], out[every, rr, cc] = there, here
    return ndimage.gaussian_filter(out, sigma=(0, sigma, sigma, 0), mode="nearest")


def _disk(radius: float, alias_sigma: float) -> np.ndarray:
    """A normalised disk of ``radius`` pixels on an odd grid, smoothed by a Gaussian of ``alias_sigma`` (anti-alias)."""
    half = max(1, int(np.ceil(radius)) + 1)
    grid = np.arange(-half, half + 1)
    rows, cols = np.meshgrid(grid, grid, indexing="ij")
    disk = (rows**2 + cols**2 <= radius**2).astype(np.float64)
    disk = ndimage.gaussian_filter(disk, alias_sigma, mode="constant", truncate=2.0)
    return disk / disk.sum()


def defocus_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Convolution with an anti-aliased disk of radius 0.3 .. 1.5 pixels (at 32 pixels): an out-of-focus lens."""
    radius, alias = ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1.0, 0.2), (1.5, 0.1))[severity - 1]
    kernel = _disk(radius * _spatial(x), alias * _spatial(x))
    return ndimage.convolve(x, kernel[None, :, :, None], mode="nearest")


def _motion_kernel(length: float, sigma: float, angle_degrees: float) -> np.ndarray:
    """A one-sided streak ``length`` pixels long at ``angle_degrees``, Gaussian-weighted (``sigma``) from its
    start, splatted bilinearly onto an odd grid and normalised."""
    half = int(np.ceil(length)) + 1
    kernel = np.zeros((2 * half + 1, 2 * half + 1))
    t = np.linspace(0.0, length, max(2, int(np.ceil(length)) * 4 + 1))
    weight = np.exp(-(t**2) / (2 * sigma**2))
    theta = np.deg2rad(angle_degrees)
    rows, cols = half - t * np.sin(theta), half + t * np.cos(theta)
    r0, c0 = np.floor(rows).astype(int), np.floor(cols).astype(int)
    fr, fc = rows - r0, cols - c0
    for dr, dc, share in ((0, 0, (1 - fr) * (1 - fc)), (1, 0, fr * (1 - fc)), (0, 1, (1 - fr) * fc), (1, 1, fr * fc)):
        np.add.at(kernel, (r0 + dr, c0 + dc), weight * share)
    return kernel / kernel.sum()


def motion_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """A streak of length 6 .. 9 pixels (at 32 pixels, Gaussian weight sigma 1 .. 2.5) at a random angle in
    [-45, 45] degrees per image: camera shake."""
    length, sigma = ((6, 1.0), (6, 1.5), (6, 2.0), (8, 2.0), (9, 2.5))[severity - 1]
    scale = _spatial(x)
    kernels = [_motion_kernel(length * scale, sigma * scale, a) for a in rng.uniform(-45, 45, size=x.shape[0])]
    return _each_channel(x, lambda plane, i: ndimage.convolve(plane, kernels[i], mode="nearest"))


def _zoomed(x: np.ndarray, factor: float) -> np.ndarray:
    """Each image magnified ``factor`` times about its centre, cropped back to its size (bilinear)."""
    h, w = x.shape[1:3]
    matrix = np.diag([1.0, 1 / factor, 1 / factor, 1.0])
    centre = np.array([0.0, (h - 1) / 2, (w - 1) / 2, 0.0])
    return ndimage.affine_transform(x, matrix, offset=centre - matrix @ centre, order=1, mode="nearest")


def zoom_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """The mean of the image and its magnifications by 1.00, 1.01, ... up to 1.05 .. 1.25: a zooming camera."""
    top = (1.06, 1.11, 1.16, 1.21, 1.26)[severity - 1]
    factors = np.arange(1.0, top, 0.01)
    return (x + sum(_zoomed(x, f) for f in factors)) / (len(factors) + 1)


# ---------------------------------------------------------------------------------------------------- digital
def contrast(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Each image's deviations from its own mean shrunk to 0.75 .. 0.15 of their size."""
    factor = (0.75, 0.5, 0.4, 0.3, 0.15)[severity - 1]
    mean = x.mean(axis=(1, 2), keepdims=True)
    return (x - mean) * factor + mean


def brightness(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """The HSV value raised by 0.05 .. 0.30 (for grey images: every pixel)."""
    shift = (0.05, 0.1, 0.15, 0.2, 0.3)[severity - 1]
    if x.shape[3] == 1:
        return x + shift
    from matplotlib.colors import hsv_to_rgb, rgb_to_hsv

    hsv = rgb_to_hsv(np.clip(x, 0.0, 1.0))
    hsv[..., 2] = np.clip(hsv[..., 2] + shift, 0.0, 1.0)
    return hsv_to_rgb(hsv)


def _affine_from_points(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The 2x3 affine map sending three source points onto three target points (rows, columns)."""
    lhs = np.hstack([source, np.ones((3, 1))])
    return np.linalg.solve(lhs, target).T


def elastic_transform(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """A small random affine warp, then a smooth random displacement field (alpha, sigma, affine jitter in units
    of the image side: (0, 0, 0.08) .. (0.1, 0.03, 0.03))."""
    alpha, sigma, jitter = ((0.0, 0.0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06), (0.1, 0.04, 0.05),
                            (0.1, 0.03, 0.03))[severity - 1]
    n, h, w, ch = x.shape
    side = min(h, w)
    alpha, sigma, jitter = alpha * side, sigma * side, jitter * side
    centre, arm = np.array([h // 2, w // 2], dtype=np.float64), side // 3
    points = np.array([centre + arm, [centre[0] + arm, centre[1] - arm], centre - arm])
    rows, cols = np.meshgrid(np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64), indexing="ij")
    out = np.empty_like(x)
    for i in range(n):
        # where each output pixel reads from: the inverse of the map moving the points by the jitter
        inverse = _affine_from_points(points + rng.uniform(-jitter, jitter, size=points.shape), points)
        src_r = inverse[0, 0] * rows + inverse[0, 1] * cols + inverse[0, 2]
        src_c = inverse[1, 0] * rows + inverse[1, 1] * cols + inverse[1, 2]
        if alpha > 0:
            for grid in (src_r, src_c):
                field = ndimage.gaussian_filter(rng.uniform(-1, 1, size=(h, w)), sigma, mode="reflect", truncate=3)
                grid += field * alpha
        for c in range(ch):
            out[i, :, :, c] = ndimage.map_coordinates(x[i, :, :, c], [src_r, src_c], order=1, mode="reflect")
    return out


def pixelate(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Box-downsampled to 0.95 .. 0.65 of the side and box-upsampled back."""
    from PIL import Image

    factor = (0.95, 0.9, 0.85, 0.75, 0.65)[severity - 1]
    h, w = x.shape[1:3]
    small = (max(1, int(w * factor)), max(1, int(h * factor)))

    def one(plane: np.ndarray, i: int) -> np.ndarray:
        image = Image.fromarray(plane.astype(np.float32), mode="F")
        return np.asarray(image.resize(small, Image.BOX).resize((w, h), Image.BOX), dtype=x.dtype)

    return _each_channel(x, one)


def jpeg_compression(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Each image saved as a JPEG at quality 80 .. 40 and read back (8-bit, like every JPEG)."""
    from PIL import Image

    quality = (80, 65, 58, 50, 40)[severity - 1]
    grey = x.shape[3] == 1
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        pixels = np.round(np.clip(x[i], 0.0, 1.0) * 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels[..., 0] if grey else pixels, mode="L" if grey else "RGB").save(
            buffer, format="JPEG", quality=quality)
        back = np.asarray(Image.open(buffer), dtype=np.float64) / 255.0
        out[i] = back[..., None] if grey else back
    return out


CORRUPTIONS: dict[str, Corruption] = {fn.__name__: fn for fn in (
    gaussian_noise, shot_noise, impulse_noise, speckle_noise,
    gaussian_blur, glass_blur, defocus_blur, motion_blur, zoom_blur,
    contrast, brightness, elastic_transform, pixelate, jpeg_compression)}


def check_corruption(name: str, severity: int) -> None:
    """Refuse an unknown corruption or a severity outside 1..5, listing the valid ones."""
    if name not in CORRUPTIONS:
        raise ZooInputError("corruption", name, f"use one of {', '.join(CORRUPTIONS)}")
    if isinstance(severity, bool) or not isinstance(severity, int | np.integer) or severity not in SEVERITIES:
        raise ZooInputError("severity", severity, "use an integer severity from 1 (mildest) to 5 (strongest)")


def corrupt_images(images: np.ndarray, name: str, severity: int, seed: int) -> np.ndarray:
    """``images`` ``[N, H, W, C]`` in ``[0, 1]`` under corruption ``name`` at ``severity``, clipped to ``[0, 1]``;
    the same (seed, name, severity) gives the same output."""
    check_corruption(name, severity)
    images = np.asarray(images, dtype=np.float64)
    if images.ndim != 4:
        raise ZooInputError("images", f"shape {images.shape}", "pass images as [N, H, W, C]")
    index = list(CORRUPTIONS).index(name)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), CORRUPTION_STREAM, index, int(severity)]))
    return np.clip(CORRUPTIONS[name](images, int(severity), rng), 0.0, 1.0)


def rotate_images(images: np.ndarray, degrees: float) -> np.ndarray:
    """``images`` ``[N, H, W, C]`` rotated anticlockwise by ``degrees`` about their centres (bilinear, black
    outside), kept inside the input's own range: the rotated-MNIST shift, in any pixel units."""
    images = np.asarray(images, dtype=np.float64)
    if degrees % 360 == 0:
        return images.copy()
    turned = ndimage.rotate(images, float(degrees), axes=(2, 1), reshape=False, order=1, mode="constant", cval=0.0)
    return np.clip(turned, images.min(), images.max())
