"""The one backend registry of matroot's tools and tests: which array libraries and
devices exist here.

The library never imports a backend (``matroot._xp`` recognises one from its
arrays). Tools and tests have to create arrays, so ``matroot info``, the demo, the
benchmarks, matroot's test suite (its ``backend`` fixture) and a solver author's
tests all find libraries and devices here, lazily and without failing when one is
missing or has no driver. A :class:`Target` is one
backend on one device; its :attr:`~Target.name` (``"numpy"``, ``"torch"``,
``"torch-cuda"``, ``"array_api_strict"``, ``"jax"``, ``"cupy"``) is what every tool prints
and accepts.
"""

from __future__ import annotations

import glob
import importlib
import importlib.metadata
import os
import sys
from dataclasses import dataclass, field

import numpy as np

__all__ = ["BACKENDS", "Target", "BackendInfo", "UnavailableError", "discover",
           "accelerator_possible",
           "select_targets", "candidate_targets", "parse_target", "target_named"]

#: Backends in the order every tool lists them; the first device is each one's default.
BACKENDS = ("numpy", "torch", "array_api_strict", "jax", "cupy")
_DEFAULT_DEVICE = {"numpy": "cpu", "torch": "cpu", "array_api_strict": "cpu", "jax": "cpu",
                   "cupy": "cuda:0"}
_ALIASES = {"array-api-strict": "array_api_strict", "strict": "array_api_strict"}
_INSTALL_HINT = {
    "torch": 'pip install "matroot[torch]" (CPU-only: pip install torch --index-url '
             "https://download.pytorch.org/whl/cpu)",
    "array_api_strict": "pip install array-api-strict",
    "jax": 'pip install "matroot[jax]"',
    "cupy": 'pip install "matroot[cupy]" (needs an NVIDIA GPU and its driver)',
}


class UnavailableError(Exception):
    """A backend or device that was asked for cannot be used here."""


@dataclass(frozen=True)
class BackendInfo:
    """What is known about one backend: its version and devices, or why it is missing."""

    name: str
    version: str | None = None
    devices: tuple[str, ...] = ()
    device_names: dict = field(default_factory=dict)
    missing: str | None = None

    @property
    def available(self) -> bool:
        return self.missing is None


def _device_index(device: str) -> int:
    return int(device.split(":", 1)[1]) if ":" in device else 0


@dataclass(frozen=True)
class Target:
    """One backend on one device: where a tool builds arrays and times work.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.testing.backends import Target
    >>> target = Target("numpy", "cpu")
    >>> target.name, Target("torch", "cuda:0").name
    ('numpy', 'torch-cuda')
    >>> target.to_host(target.asarray(np.eye(2), "float32")).dtype
    dtype('float32')
    """

    backend: str
    device: str

    @property
    def name(self) -> str:
        """``backend`` on its default device, else ``backend-device`` (cuda:0 as cuda)."""
        if self.device == _DEFAULT_DEVICE[self.backend]:
            return self.backend
        return f"{self.backend}-{'cuda' if self.device == 'cuda:0' else self.device}"

    @property
    def label(self) -> str:
        return self.backend if self.device == "cpu" else f"{self.backend} ({self.device})"

    @property
    def is_accelerator(self) -> bool:
        return self.device != "cpu"

    @property
    def xp(self):
        """The array-API namespace of this backend (array-api-compat's wrapper)."""
        if self.backend == "jax":
            # The tools' float64 rows and oracles need JAX's float64, which is off
            # by default; a tool turns it on for the process it runs in.
            importlib.import_module("jax").config.update("jax_enable_x64", True)
            return importlib.import_module("jax.numpy")
        if self.backend == "array_api_strict":
            return importlib.import_module("array_api_strict")
        return importlib.import_module(f"array_api_compat.{self.backend}")

    @property
    def xp_device(self):
        """The device to pass as ``device=`` to :attr:`xp`'s functions (None: its default)."""
        if self.backend == "torch":
            return self.device
        if self.backend == "cupy" and self.device != "cuda:0":
            return importlib.import_module("cupy").cuda.Device(_device_index(self.device))
        if self.backend == "jax":
            return self._jax_device()
        return None

    def _jax_device(self):
        # JAX puts new arrays on its default device, a GPU where it has one: a
        # target names its device explicitly, so "jax" stays on the CPU.
        jax = importlib.import_module("jax")
        if self.device == "cpu":
            return jax.devices("cpu")[0]
        return jax.devices("gpu")[_device_index(self.device)]

    def asarray(self, host, dtype=None):
        """Copy a host array onto this target, in ``dtype`` (a name or dtype) if given."""
        host = np.ascontiguousarray(host)
        if self.backend == "torch":
            out = importlib.import_module("torch").from_numpy(host).to(self.device)
        elif self.backend == "cupy":
            cupy = importlib.import_module("cupy")
            with cupy.cuda.Device(_device_index(self.device)):
                out = cupy.asarray(host)
        elif self.backend == "jax":
            out = importlib.import_module("jax").device_put(self.xp.asarray(host),
                                                            self._jax_device())
        else:
            out = self.xp.asarray(host)
        if dtype is not None:
            xp = self.xp
            out = xp.astype(out, getattr(xp, dtype) if isinstance(dtype, str) else dtype)
        return out

    def to_host(self, x) -> np.ndarray:
        """A NumPy copy of an array of this backend."""
        if self.backend == "torch":
            return x.detach().cpu().numpy()
        if self.backend == "cupy":
            return x.get()
        if self.backend in ("numpy", "jax"):
            return np.asarray(x)
        return np.from_dlpack(x)

    def synchronize(self) -> None:
        """Wait for queued device work, so a wall-clock timer covers it."""
        if self.backend == "torch" and self.device != "cpu":
            importlib.import_module("torch").cuda.synchronize(self.device)
        elif self.backend == "cupy":
            cupy = importlib.import_module("cupy")
            cupy.cuda.Device(_device_index(self.device)).synchronize()
        elif self.backend == "jax" and self.device != "cpu":
            # JAX has no device-wide wait; a trivial computation queued behind the
            # work runs after it, and waiting for that one waits for the queue.
            jax = importlib.import_module("jax")
            jax.block_until_ready(jax.device_put(0.0, self._jax_device()) + 1.0)


def normalize_backend(name: str) -> str:
    """The canonical backend name for ``name``; UnavailableError for an unknown one."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in BACKENDS:
        raise UnavailableError(f"unknown backend {name!r}; choose from " + ", ".join(BACKENDS))
    return key


def normalize_device(name: str) -> str:
    """``"cuda"`` (or ``"gpu"``) means ``"cuda:0"``; other names are kept, lower-cased."""
    key = name.strip().lower()
    return "cuda:0" if key in ("cuda", "gpu") else key


def parse_target(name: str) -> tuple[str, str | None]:
    """``"torch-cuda"`` -> ``("torch", "cuda:0")``; ``"numpy"`` -> ``("numpy", None)``."""
    key = name.strip().lower()
    if key in _ALIASES or key in BACKENDS or "-" not in key:
        return normalize_backend(key), None
    backend, device = key.split("-", 1)
    if _ALIASES.get(backend, backend) not in BACKENDS:
        normalize_backend(name)  # raises, naming the whole of what was given
    return normalize_backend(backend), normalize_device(device)


def target_named(name: str) -> Target:
    """The target a :attr:`Target.name` stands for (not checked for availability).

    Examples
    --------
    >>> from matroot.testing.backends import target_named
    >>> target_named("torch-cuda"), target_named("cupy").device
    (Target(backend='torch', device='cuda:0'), 'cuda:0')
    """
    backend, device = parse_target(name)
    return Target(backend, device or _DEFAULT_DEVICE[backend])


def _missing(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}".strip()


def _probe_numpy() -> BackendInfo:
    return BackendInfo("numpy", np.__version__, ("cpu",))


def _probe_torch() -> BackendInfo:
    try:
        import torch
    except Exception as err:  # a broken install must not stop the other backends
        return BackendInfo("torch", missing=_missing(err))
    devices, names = ["cpu"], {}
    try:
        for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
            devices.append(f"cuda:{i}")
            names[f"cuda:{i}"] = torch.cuda.get_device_name(i)
    except Exception:  # a driver problem leaves the CPU usable
        pass
    return BackendInfo("torch", torch.__version__, tuple(devices), names)


def _probe_array_api_strict() -> BackendInfo:
    try:
        import array_api_strict
    except Exception as err:
        return BackendInfo("array_api_strict", missing=_missing(err))
    return BackendInfo("array_api_strict", array_api_strict.__version__, ("cpu",))


def _probe_cupy() -> BackendInfo:
    try:
        import cupy
    except Exception as err:
        return BackendInfo("cupy", missing=_missing(err))
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as err:  # installed, but no driver or no GPU
        return BackendInfo("cupy", cupy.__version__, missing=_missing(err))
    if count == 0:
        return BackendInfo("cupy", cupy.__version__, missing="no CUDA device found")
    devices = tuple(f"cuda:{i}" for i in range(count))
    names = {}
    for i, dev in enumerate(devices):
        name = cupy.cuda.runtime.getDeviceProperties(i)["name"]
        names[dev] = name.decode() if isinstance(name, bytes) else str(name)
    return BackendInfo("cupy", cupy.__version__, devices, names)


def _probe_jax() -> BackendInfo:
    try:
        import jax
    except Exception as err:
        return BackendInfo("jax", missing=_missing(err))
    devices, names = ["cpu"], {}
    try:  # a jaxlib with a CUDA plugin also has GPU devices
        for i, device in enumerate(jax.devices("gpu")):
            devices.append(f"cuda:{i}")
            names[f"cuda:{i}"] = str(device.device_kind)
    except Exception:  # no GPU backend (RuntimeError), or a broken plugin
        pass
    return BackendInfo("jax", jax.__version__, tuple(devices), names)


_PROBES = {"numpy": _probe_numpy, "torch": _probe_torch,
           "array_api_strict": _probe_array_api_strict, "jax": _probe_jax,
           "cupy": _probe_cupy}


#: Device files whose presence means a GPU or TPU may be here: NVIDIA, AMD ROCm, a GPU
#: under WSL, and (``/dev/accel*``) TPUs.
_ACCELERATOR_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")
#: The distribution that installs each backend whose import is slow (seconds).
_DISTRIBUTIONS = {"torch": "torch", "jax": "jax"}


def accelerator_possible() -> bool:
    """Whether this machine may have an accelerator: a GPU's or TPU's device file, or macOS.

    False means no backend can have a device but its CPU, so a tool that wants only
    accelerators need not import torch or JAX (seconds each) to find that out.
    """
    return (sys.platform == "darwin" or any(os.path.exists(f) for f in _ACCELERATOR_FILES)
            or bool(glob.glob("/dev/accel*")))


def _installed_cpu_only(name: str) -> BackendInfo:
    """``name`` as package metadata describes it, not imported: its CPU, or why it is missing."""
    try:
        version = importlib.metadata.version(_DISTRIBUTIONS[name])
    except importlib.metadata.PackageNotFoundError:
        return BackendInfo(name, missing=f"No module named {name!r}")
    return BackendInfo(name, version, ("cpu",))


def discover(names=BACKENDS, *, import_all: bool = True) -> list[BackendInfo]:
    """Probe the named backends (all known ones by default); only those are imported.

    With ``import_all=False`` on a machine where :func:`accelerator_possible` is false,
    torch and JAX are not imported: their versions come from the installed package's
    metadata and their one device is the CPU (a broken install then shows only when
    used). ``matroot info`` does this by default, to answer in about a second.
    """
    light = () if import_all or accelerator_possible() else tuple(_DISTRIBUTIONS)
    return [_installed_cpu_only(name) if name in light else _PROBES[name]()
            for name in names]


def candidate_targets() -> list[tuple[Target, str | None]]:
    """Every target the test suite runs on, each with the reason it is missing (or None).

    Each backend on its default device, plus torch and JAX on the first GPU.
    """
    out = []
    for info in discover():
        wanted = [_DEFAULT_DEVICE[info.name]] + (["cuda:0"] if info.name in ("torch", "jax")
                                                 else [])
        for device in wanted:
            reason = None
            if info.missing is not None:
                reason = f"{info.missing}; {_INSTALL_HINT.get(info.name, '')}".rstrip("; ")
            elif device not in info.devices:
                reason = f"{info.name} {info.version} has no device {device}"
            out.append((Target(info.name, device), reason))
    return out


def select_targets(backends=None, device=None) -> list[Target]:
    """The (backend, device) pairs to run on.

    Parameters
    ----------
    backends : list of str, optional
        Backend names (``"torch-cuda"`` names a device too); default every
        available backend.
    device : str, optional
        ``"cpu"``, ``"cuda"``, ``"cuda:1"``; default every device of each backend.

    Raises
    ------
    UnavailableError
        An unknown or missing backend, or a device none of the chosen backends has.

    Examples
    --------
    >>> from matroot.testing.backends import select_targets
    >>> [t.name for t in select_targets(["numpy"])]
    ['numpy']
    """
    named = backends is not None
    parsed: list[tuple[str, str | None]] = (
        [parse_target(b) for b in backends] if backends is not None
        else [(b, None) for b in BACKENDS])
    if device is not None:
        parsed = [(b, d or normalize_device(device)) for b, d in parsed]
    infos = {i.name: i for i in discover(list(dict.fromkeys(b for b, _ in parsed)))}
    targets = []
    for backend, dev in parsed:
        info = infos[backend]
        if not info.available:
            if not named:
                continue
            hint = _INSTALL_HINT.get(backend, "")
            raise UnavailableError(f"backend {backend!r} is not available: {info.missing}"
                                   + (f"; {hint}" if hint else ""))
        if dev is not None and dev not in info.devices:
            if named:
                raise UnavailableError(
                    f"device {dev!r} is not available for {backend} {info.version} "
                    f"(its devices here: {', '.join(info.devices)})")
            continue
        targets += [Target(backend, d) for d in ([dev] if dev else info.devices)]
    targets = list(dict.fromkeys(targets))
    if not targets:
        have = "; ".join(f"{i.name}: {', '.join(i.devices)}" for i in infos.values()
                         if i.available)
        raise UnavailableError(f"device {device!r} is not available: no installed "
                               f"backend has it ({have})")
    return targets
