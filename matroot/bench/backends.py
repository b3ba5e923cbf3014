"""The array backends a benchmark can run on, found at run time.

This is the one bench module that imports torch or cupy. Each :class:`Backend`
knows how to move a host array onto its device, how to wait for queued device
work (so a timer measures the work and not its launch) and how to bring a result
back for the oracle comparison.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from collections.abc import Callable

import numpy as np
from array_api_compat import array_namespace

__all__ = ["Backend", "discover_backends", "BACKEND_NAMES"]

BACKEND_NAMES = ("numpy", "torch-cpu", "torch-cuda", "cupy")


@dataclass
class Backend:
    """One array library on one device.

    Attributes
    ----------
    name : str
        One of :data:`BACKEND_NAMES`.
    device : str
        "cpu" or the accelerator's name.
    to_device : callable
        ``to_device(np.ndarray) -> array`` on this backend's device.
    to_host : callable
        ``to_host(array) -> np.ndarray``.
    synchronize : callable
        Blocks until all queued work on the device is done (no-op on a CPU).
    versions : dict
        Library versions, for the results' machine description.
    """

    name: str
    device: str
    to_device: Callable
    to_host: Callable
    synchronize: Callable
    versions: dict = field(default_factory=dict)

    @property
    def is_accelerator(self) -> bool:
        return self.device != "cpu"

    def namespace(self, x):
        """The array-API namespace of an array of this backend."""
        return array_namespace(x)


def _no_sync():
    return None


def _numpy_backend():
    return Backend("numpy", "cpu", np.ascontiguousarray, np.asarray, _no_sync,
                   {"numpy": np.__version__})


def _torch_backends():
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return [], {"torch-cpu": "torch is not installed",
                    "torch-cuda": "torch is not installed"}

    def host(x):
        return x.detach().cpu().numpy()

    found = [Backend("torch-cpu", "cpu", torch.from_numpy, host, _no_sync,
                     {"torch": torch.__version__})]
    if not torch.cuda.is_available():
        return found, {"torch-cuda": "torch.cuda.is_available() is False"}
    name = torch.cuda.get_device_name(0)
    found.append(Backend("torch-cuda", name,
                         lambda a: torch.from_numpy(a).to("cuda"), host,
                         torch.cuda.synchronize,
                         {"torch": torch.__version__, "cuda": torch.version.cuda}))
    return found, {}


def _cupy_backend():
    try:
        cupy = importlib.import_module("cupy")
    except ImportError:
        return None, "cupy is not installed"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None, "cupy sees no CUDA device"
        props = cupy.cuda.runtime.getDeviceProperties(0)
    except Exception as err:  # CUDARuntimeError when no driver is present.
        return None, f"cupy cannot reach a CUDA device ({err})"
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)

    def synchronize():
        cupy.cuda.get_current_stream().synchronize()

    return Backend("cupy", name, cupy.asarray, cupy.asnumpy, synchronize,
                   {"cupy": cupy.__version__}), None


def discover_backends(wanted=None):
    """The backends present on this machine, and why the others are not.

    Parameters
    ----------
    wanted : iterable of str, optional
        Restrict to these names (see :data:`BACKEND_NAMES`); default all.

    Returns
    -------
    (list of Backend, dict of name -> reason it was skipped)

    Examples
    --------
    >>> from matroot.bench.backends import discover_backends
    >>> found, skipped = discover_backends(["numpy"])
    >>> [b.name for b in found]
    ['numpy']
    """
    wanted = tuple(BACKEND_NAMES if wanted is None else wanted)
    unknown = [w for w in wanted if w not in BACKEND_NAMES]
    if unknown:
        raise ValueError(f"unknown backend(s) {unknown}; choose from {list(BACKEND_NAMES)}")
    # Only the libraries asked for are imported: a benchmark worker for one
    # backend keeps the others' thread pools out of its process.
    found = [_numpy_backend()] if "numpy" in wanted else []
    skipped = {}
    if any(w.startswith("torch") for w in wanted):
        torch_found, torch_skipped = _torch_backends()
        found += torch_found
        skipped.update(torch_skipped)
    if "cupy" in wanted:
        cupy_found, reason = _cupy_backend()
        if cupy_found is None:
            skipped["cupy"] = reason
        else:
            found.append(cupy_found)
    found = [b for b in found if b.name in wanted]
    skipped = {k: v for k, v in skipped.items() if k in wanted}
    return found, skipped
