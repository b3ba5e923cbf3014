"""Which array libraries and devices this installation can run on.

The library itself never imports a backend (only ``matroot._xp`` recognises one
from its arrays); the command line has to create arrays, so it is the one place
that looks for installed libraries and their devices, lazily and without
failing when one is missing or has no driver.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import numpy as np

#: Backends in the order the demo and ``info`` list them.
BACKENDS = ("numpy", "torch", "array_api_strict", "cupy")
_ALIASES = {"array-api-strict": "array_api_strict", "strict": "array_api_strict"}
_INSTALL_HINT = {
    "torch": "pip install torch",
    "array_api_strict": "pip install array-api-strict",
    "cupy": "pip install cupy-cuda12x (needs an NVIDIA GPU and its driver)",
}


class UnavailableError(Exception):
    """A backend or device named on the command line cannot be used here."""


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


@dataclass(frozen=True)
class Target:
    """One backend on one device: where the demo builds arrays and times solves."""

    backend: str
    device: str

    @property
    def label(self) -> str:
        return self.backend if self.device == "cpu" else f"{self.backend} ({self.device})"

    def asarray(self, host: np.ndarray):
        """Copy a host array onto this target, keeping its dtype."""
        host = np.ascontiguousarray(host)
        if self.backend == "numpy":
            return host
        module = importlib.import_module(self.backend)
        if self.backend == "torch":
            return module.from_numpy(host).to(self.device)
        if self.backend == "cupy":
            with module.cuda.Device(_device_index(self.device)):
                return module.asarray(host)
        return module.asarray(host)

    def synchronize(self):
        """Wait for queued device work, so wall-clock timings cover it."""
        if self.backend == "torch" and self.device != "cpu":
            import torch

            torch.cuda.synchronize(self.device)
        elif self.backend == "cupy":
            import cupy

            cupy.cuda.Device(_device_index(self.device)).synchronize()


def _device_index(device: str) -> int:
    return int(device.split(":", 1)[1]) if ":" in device else 0


def normalize_backend(name: str) -> str:
    """The canonical backend name for ``name``, or UnavailableError for an unknown one."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in BACKENDS:
        raise UnavailableError(
            f"unknown backend {name!r}; choose from " + ", ".join(BACKENDS))
    return key


def normalize_device(name: str) -> str:
    """``"cuda"`` means ``"cuda:0"``; other names are kept (lower-cased)."""
    key = name.strip().lower()
    return "cuda:0" if key in ("cuda", "gpu") else key


def _missing(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}".strip()


def _probe_numpy() -> BackendInfo:
    return BackendInfo("numpy", np.__version__, ("cpu",))


def _probe_torch() -> BackendInfo:
    try:
        import torch
    except Exception as err:  # a broken install must not stop the other backends
        return BackendInfo("torch", missing=_missing(err))
    devices = ["cpu"]
    names = {}
    try:
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
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
        try:
            name = cupy.cuda.runtime.getDeviceProperties(i)["name"]
            names[dev] = name.decode() if isinstance(name, bytes) else str(name)
        except Exception:
            pass
    return BackendInfo("cupy", cupy.__version__, devices, names)


_PROBES = {
    "numpy": _probe_numpy,
    "torch": _probe_torch,
    "array_api_strict": _probe_array_api_strict,
    "cupy": _probe_cupy,
}


def discover(names=BACKENDS) -> list[BackendInfo]:
    """Probe the named backends (all known ones by default)."""
    return [_PROBES[name]() for name in names]


def select_targets(backends=None, device=None) -> list[Target]:
    """The (backend, device) pairs to run on.

    Parameters
    ----------
    backends : list of str, optional
        Backend names; default every available backend.
    device : str, optional
        A device name (``"cpu"``, ``"cuda"``, ``"cuda:1"``); default every
        device of each backend.

    Raises
    ------
    UnavailableError
        An unknown or missing backend, or a device none of the chosen backends has.
    """
    named = backends is not None
    names = list(dict.fromkeys(normalize_backend(b) for b in backends)) if named \
        else list(BACKENDS)
    infos = discover(names)
    if named:
        for info in infos:
            if not info.available:
                hint = _INSTALL_HINT.get(info.name, "")
                raise UnavailableError(
                    f"backend {info.name!r} is not available: {info.missing}"
                    + (f"; {hint}" if hint else ""))
    infos = [info for info in infos if info.available]
    if device is None:
        return [Target(info.name, dev) for info in infos for dev in info.devices]
    dev = normalize_device(device)
    lacking = [info for info in infos if dev not in info.devices]
    if named and lacking:
        info = lacking[0]
        raise UnavailableError(
            f"device {device!r} is not available for {info.name} {info.version} "
            f"(its devices here: {', '.join(info.devices)})")
    targets = [Target(info.name, dev) for info in infos if dev in info.devices]
    if not targets:
        have = "; ".join(f"{i.name}: {', '.join(i.devices)}" for i in infos)
        raise UnavailableError(
            f"device {device!r} is not available: no installed backend has it ({have})")
    return targets
