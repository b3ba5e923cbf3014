"""Run by tests/distributed/test_muon_distributed_optax.py in a fresh process with two
host devices (``XLA_FLAGS=--xla_force_host_platform_device_count=2``, set before JAX
starts): the optax Muon shell with ``stack_sharding`` against the same steps on one
device. Prints one JSON line."""

from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from matroot.optim.optax import muon

STEPS = 5
OPTIONS = dict(weight_decay=0.1, adamw_lr_ratio=0.15)


def _params():
    keys = jax.random.split(jax.random.PRNGKey(0), 7)
    shapes = {"embed": (10, 8), "w0": (8, 8), "w1": (8, 8), "w2": (8, 8), "up": (16, 8),
              "experts": (4, 8, 4), "bias": (8,)}
    return {name: jax.random.normal(key, shape) / 3
            for key, (name, shape) in zip(keys, shapes.items())}


def _loss(params, step):
    x = jax.random.normal(jax.random.PRNGKey(100 + step), (16, 3))
    tokens = jax.random.randint(jax.random.PRNGKey(200 + step), (16,), 0, 10)
    h = params["embed"][tokens]
    for name in ("w0", "w1", "w2"):
        h = jnp.tanh(h @ params[name].T + params["bias"])
    up = jnp.tanh(h @ params["up"].T)                       # (16, 16)
    mixed = jnp.einsum("bi,eoi->bo", up[:, :4], params["experts"])
    return jnp.mean((mixed[:, :3] - x) ** 2) + 1e-3 * jnp.sum(up ** 2)


def _train(params, opt):
    state = opt.init(params)

    @jax.jit
    def step(params, state, i):
        grads = jax.grad(_loss)(params, i)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for i in range(STEPS):
        params, state = step(params, state, i)
    return params, state, step.lower(params, state, 0).compile().as_text()


def _dot_batches(hlo: str) -> set[int]:
    """Leading (batch) sizes of the 3-D dot products of a compiled module."""
    return {int(m) for m in re.findall(r"= f32\[(\d+),\d+,\d+\][^ ]* dot\(", hlo)}


def _bytes_here(tree) -> tuple[int, int]:
    """(bytes of the arrays on device 0, bytes of the whole arrays)."""
    leaves = [x for x in jax.tree_util.tree_leaves(tree) if hasattr(x, "addressable_shards")
              and x.ndim]
    here = sum(s.data.nbytes for x in leaves for s in x.addressable_shards
               if s.device == jax.devices()[0])
    return here, sum(x.nbytes for x in leaves)


def main():
    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("data",))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    params = _params()
    single = jax.device_put(params, devices[0])
    sharded = jax.device_put(params, rows)          # every first dimension is even
    ref, ref_state, ref_hlo = _train(single, muon(0.02, **OPTIONS))
    out, state, hlo = _train(sharded, muon(0.02, stack_sharding=rows, **OPTIONS))
    moved = max(float(jnp.abs(a - b).max()) for a, b in
                zip(jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(params)))
    diff = max(float(jnp.abs(jax.device_get(a) - jax.device_get(b)).max())
               for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref)))
    here, total = _bytes_here(state)
    print(json.dumps({"devices": len(devices), "diff": diff, "moved": moved,
                      "state_here": here, "state_total": total,
                      "single_batches": sorted(_dot_batches(ref_hlo)),
                      "sharded_batches": sorted(_dot_batches(hlo)),
                      "all_to_all": "all-to-all" in hlo}))


if __name__ == "__main__":
    main()
