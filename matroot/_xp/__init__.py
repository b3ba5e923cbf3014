"""Array-namespace seam: the only package that knows which array library is in use.

Everything else in matroot receives ``xp`` (an array-API namespace) and calls the
helpers here for what the standard leaves out. One module per concern, each
importing only those listed before it:

- :mod:`~matroot._xp.namespace`: which library and device an array belongs to,
  and whether its values can be read on the host (not while a trace runs);
- :mod:`~matroot._xp.transfer`: copies to and from host NumPy arrays;
- :mod:`~matroot._xp.precision`: dtypes per backend, their unit roundoff and 16-bit
  rounding;
- :mod:`~matroot._xp.tracing`: loops, branches and constants that work eagerly,
  under ``jax.jit`` and under ``torch.compile``, and LAPACK calls kept in order
  inside a JAX trace;
- :mod:`~matroot._xp.linalg`: batched linear algebra on ``(b, n, n)`` stacks (the
  products and ``beta*c + alpha*(a @ b)`` sums torch forms in one operation,
  per-matrix Cholesky success, finiteness);
- :mod:`~matroot._xp.matmul`: :class:`Matmul`, batched products under a precision
  policy, counted, and integer matrix powers by binary powering;
- :mod:`~matroot._xp.launches`: device constants made once per size and reused, and
  entry-wise maps in the fewest operations (what a call launches on a GPU);
- :mod:`~matroot._xp.foreach`: one elementwise operation over a list of arrays in
  one dispatch (torch's ``_foreach_*``), a loop elsewhere;
- :mod:`~matroot._xp.autodiff`: results attached to their input through a backward
  formula (``jax.custom_jvp``; torch autograd through
  :mod:`~matroot._xp.torch_autodiff`, imported on first use); torch.func transforms
  refused.

The rest of matroot imports this package (``from matroot import _xp``), never
one of its modules, so a helper can move between them freely.
"""

from __future__ import annotations

from .autodiff import gradient_flows, refuse_torch_func, with_gradient, without_gradient
from .linalg import (
    add_product,
    add_scaled,
    add_scaled_identity,
    batched_matmul,
    batched_where,
    cholesky_succeeds,
    finite_matrices,
    frobenius_norm,
    identity_stack,
    inverse_root_entries,
    power_of_two_scale,
    scaled_plus_identity,
    shifted_product,
    spd_solve,
    symmetric_part,
)
from .foreach import each
from .matmul import Matmul, matrix_power, power_matmuls
from .launches import constant, constant_vector, power_of_two_inverse, root_entries, shared_identity
from .namespace import (
    array_namespace,
    backend_name,
    device_of,
    holds_no_values,
    host_reads_off,
    is_accelerator,
    is_cupy_namespace,
    is_jax_namespace,
    is_numpy_namespace,
    is_torch_namespace,
    is_traced,
)
from .precision import (
    dtype_from_name,
    eigh_runs_in_float64,
    full_float32_products,
    quiet_numpy_float_errors,
    solve_context,
    has_float64,
    round_to,
    unit_roundoff,
)
from .tracing import (
    bounded_loop,
    cond,
    counted_loop,
    host_constant,
    jax_compiled,
    lapack_in_order,
    outside_torch_compile,
    register_jax_pytree,
    trip_count,
)
from .transfer import from_numpy, to_numpy

__all__ = [
    "each",
    "array_namespace",
    "device_of",
    "is_torch_namespace",
    "is_cupy_namespace",
    "is_numpy_namespace",
    "is_jax_namespace",
    "backend_name",
    "is_accelerator",
    "is_traced",
    "holds_no_values",
    "host_reads_off",
    "to_numpy",
    "from_numpy",
    "has_float64",
    "dtype_from_name",
    "round_to",
    "eigh_runs_in_float64",
    "full_float32_products",
    "quiet_numpy_float_errors",
    "solve_context",
    "unit_roundoff",
    "bounded_loop",
    "counted_loop",
    "trip_count",
    "cond",
    "host_constant",
    "outside_torch_compile",
    "jax_compiled",
    "register_jax_pytree",
    "lapack_in_order",
    "identity_stack",
    "shared_identity",
    "constant",
    "constant_vector",
    "root_entries",
    "add_scaled_identity",
    "batched_matmul",
    "add_product",
    "add_scaled",
    "shifted_product",
    "scaled_plus_identity",
    "batched_where",
    "frobenius_norm",
    "symmetric_part",
    "power_of_two_scale",
    "power_of_two_inverse",
    "inverse_root_entries",
    "finite_matrices",
    "cholesky_succeeds",
    "spd_solve",
    "Matmul",
    "matrix_power",
    "power_matmuls",
    "refuse_torch_func",
    "gradient_flows",
    "without_gradient",
    "with_gradient",
]
