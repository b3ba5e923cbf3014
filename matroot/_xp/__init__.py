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

# Each submodule's __all__ is its public list; this package re-exports them whole.
from .autodiff import *  # noqa: F403
from .foreach import *  # noqa: F403
from .launches import *  # noqa: F403
from .linalg import *  # noqa: F403
from .matmul import *  # noqa: F403
from .namespace import *  # noqa: F403
from .precision import *  # noqa: F403
from .tracing import *  # noqa: F403
from .transfer import *  # noqa: F403
from . import (
    autodiff,
    foreach,
    launches,
    linalg,
    matmul,
    namespace,
    precision,
    tracing,
    transfer,
)

#: Every submodule's public names, so ``_xp.X`` and ``from matroot._xp import X`` agree.
__all__ = [
    *namespace.__all__,
    *transfer.__all__,
    *precision.__all__,
    *tracing.__all__,
    *linalg.__all__,
    *matmul.__all__,
    *launches.__all__,
    *foreach.__all__,
    *autodiff.__all__,
]
