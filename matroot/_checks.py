"""Input validation for the public functions, with messages that name the problem."""

from __future__ import annotations

import math
import numbers

import numpy as np

from ._xp import (array_namespace, backend_name, from_numpy, holds_no_values, is_traced,
                  to_numpy)

SCALINGS = ("power", "frobenius")
MATMUL_DTYPES = (None, "float16", "bfloat16")
COMPUTE_DTYPES = (None, "float32", "float64")
FALLBACKS = (None, "evd")


def check_stack(a, name: str = "a", *, square: bool = True):
    """Validate a stack of real floating matrices (square ones where ``square``);
    return its namespace."""
    if isinstance(a, np.matrix):
        raise TypeError(f"{name} is a numpy.matrix, whose indexing and products differ "
                        f"from arrays; pass np.asarray({name})")
    if isinstance(a, np.ma.MaskedArray):
        raise TypeError(f"{name} is a numpy masked array, whose mask would be ignored "
                        f"(masked entries used as they are); pass {name}.filled(value) "
                        f"with the value they stand for, or np.asarray({name})")
    try:
        xp = array_namespace(a)
    except TypeError as err:
        raise TypeError(
            f"{name} must be an array of a supported library (NumPy, CuPy, PyTorch, JAX, "
            f"array-api-strict), got {type(a).__name__}"
        ) from err
    # Traced (host reads off), every decision stays on the device, so shapes suffice.
    if holds_no_values(a) and not is_traced(a):
        raise ValueError(f"{name} is on torch's meta device or a FakeTensor, which holds "
                         "shapes but no values to compute with; pass a tensor on the CPU "
                         "or a GPU")
    if a.ndim < 2:
        layout = "(..., n, n)" if square else "(..., m, n); reshape a vector to (1, n) or (n, 1)"
        raise ValueError(
            f"{name} must have at least 2 dimensions {layout}, got shape {tuple(a.shape)}"
        )
    if square and a.shape[-1] != a.shape[-2]:
        raise ValueError(
            f"{name} must be a stack of square matrices (..., n, n), got shape {tuple(a.shape)}"
        )
    if not xp.isdtype(a.dtype, "real floating"):
        if xp.isdtype(a.dtype, "complex floating"):
            what = "complex matrices are not supported (only real ones)"
        elif xp.isdtype(a.dtype, "bool"):
            what = "boolean arrays are not matrices to take roots of"
        else:
            what = "integer arrays are not promoted; cast integers to float32 or float64 first"
        raise TypeError(f"{name} has dtype {a.dtype}: {what}")
    if isinstance(a, np.ndarray) and a.dtype == np.longdouble and np.longdouble != np.float64:
        raise TypeError(f"{name} has dtype {a.dtype} (long double): matroot computes in "
                        f"float32 or float64 at most; pass {name}.astype(np.float64) (and "
                        "cast the result back if you need its dtype)")
    return xp


def refuse_traced(value, name: str):
    """``value``, where an option that shapes the computation (a root order, a ridge,
    a tolerance) must be known while tracing: a value traced by jax.jit or
    torch.compile is a TypeError naming the fix."""
    if not isinstance(value, numbers.Real) and hasattr(value, "shape") and is_traced(value):
        raise TypeError(
            f"{name} is traced (an argument of the jitted or compiled function), but it "
            "decides the computation's steps and must be known while tracing: pass it as "
            f"a Python number, static (jax.jit(f, static_argnames=['{name}'])) or closed "
            "over, not as a traced argument")
    return value


def check_p(p):
    """Validate a root order (a finite real ``p > 0``); return it as int or float."""
    p = refuse_traced(p, "p")
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"p must be a real number, got {type(p).__name__}")
    if not 0 < p < math.inf:  # comparisons, as in check_nonnegative
        raise ValueError(f"p must be a finite number > 0, got {p}")
    try:
        number = float(p)
    except OverflowError:  # a Python int past float64's range (10**400)
        raise ValueError(f"p ≈ 2^{int(p).bit_length() - 1} is beyond float64's range; pass "
                         "a root order below 1.8e308") from None
    return int(p) if number.is_integer() else number


def check_flag(value, name: str) -> bool:
    """A yes/no option: a bool (NumPy's included), never a string or a number whose
    truth value would stand in for it (``check_finite="no"`` checked)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_choice(value, name: str, choices):
    if value not in choices:
        raise ValueError(
            f"{name}={value!r} is not one of " + ", ".join(repr(c) for c in choices)
        )
    return value


def check_nonnegative(value, name: str) -> float:
    value = refuse_traced(value, name)
    if not isinstance(value, numbers.Real) and hasattr(value, "shape"):
        # An array (a 0-d one included) is one value for the whole stack here, and a
        # traced one could not be read: the caller converts it.
        per_matrix = (" (a ridge per matrix: add it to the diagonals yourself and pass "
                      "eps=0)" if name == "eps" else "")
        raise TypeError(f"{name} must be a Python number, got an array of shape "
                        f"{tuple(value.shape)}; pass float({name}), one value for the "
                        f"whole stack{per_matrix}")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    # Comparisons, not math.isfinite: torch.compile(dynamic=True) passes a ridge as a
    # symbolic float, which comparisons guard on and math.isfinite cannot read. NaN
    # fails both.
    number = float(value)
    if not 0 <= number < math.inf:
        raise ValueError(f"{name} must be finite and >= 0, got {value}")
    return number


#: The largest ``max_iter`` taken. The iterations converge in tens of steps and
#: chebyshev's degree stays in the thousands where it converges at all; a cap beyond
#: this only sizes per-step tables (minimax's coefficient rows, a polar schedule) to
#: no use, up to a MemoryError or a hang.
MAX_ITER_LIMIT = 10_000


def check_max_iter(value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"max_iter must be a positive integer or None, got {value!r}")
    if value > MAX_ITER_LIMIT:
        raise ValueError(f"max_iter={value} is beyond any count the methods can use (at most "
                         f"{MAX_ITER_LIMIT:,}); pass max_iter=None for the method's default, "
                         "or a smaller cap")
    return int(value)


def check_matmul_dtype(xp, value, compute_dtype_name: str):
    check_choice(value, "matmul_dtype", MATMUL_DTYPES)
    if value is None:
        return None
    if compute_dtype_name == "float64":
        raise ValueError(
            f"matmul_dtype={value!r} is for float32 computation; the input (or "
            "compute_dtype) asks for float64"
        )
    if value == "bfloat16" and backend_name(xp) not in ("torch", "jax"):
        raise ValueError(
            f"matmul_dtype='bfloat16' is not available in the {backend_name(xp)} backend "
            "(only PyTorch and JAX have bfloat16)"
        )
    if value == "float16" and not hasattr(xp, "float16"):
        raise ValueError(
            f"matmul_dtype='float16' is not available in the {backend_name(xp)} backend"
        )
    return value


def check_bound(value, name: str, xp, batch: tuple, *, traced: bool = False):
    """Validate a caller-supplied spectral bound: None, a number (positive and
    finite), or a real array of the batch shape (any namespace, or a sequence of
    numbers). Another library's array comes back in ``xp``; otherwise it is returned
    unchanged. An array's entries are not read (a traced one cannot be), so one bad
    entry affects only its own matrix. ``traced`` (the stack is, under jax.jit or
    torch.compile): only the shape is checked, as torch.compile cannot trace a look
    at a NumPy array's dtype."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number or an array of shape {batch}, got a bool")
    if isinstance(value, numbers.Real):
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be finite and > 0, got {value}")
        return float(value)
    if traced:
        _check_bound_shape(tuple(getattr(value, "shape", ())), name, batch)
        return value
    try:
        value_xp = array_namespace(value)
    except TypeError:  # a sequence of numbers (a list, a tuple) reads as a NumPy array
        value, value_xp = np.asarray(value), np
    if not value_xp.isdtype(value.dtype, ("real floating", "signed integer",
                                          "unsigned integer")):
        raise TypeError(f"{name} must be a real number or a real array of the batch shape "
                        f"{batch}, got dtype {value.dtype}")
    _check_bound_shape(tuple(value.shape), name, batch)
    if backend_name(value_xp) != backend_name(xp) and not is_traced(value):
        # Another library's array (a torch bound for a JAX stack) goes through the host.
        value = from_numpy(xp, to_numpy(value))
    return value


def _check_bound_shape(shape: tuple, name: str, batch: tuple) -> None:
    if shape not in ((), batch):
        raise ValueError(f"{name} must be a number or an array of the batch shape {batch}, "
                         f"got shape {shape}")
