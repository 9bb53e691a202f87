"""One precision policy for every computation of rbjax (scoring, training, generation, DST/CRG): the compute,
accumulation and parameter-storage dtypes, and their sizes in bytes.

A *policy* names the dtype of the matmul inputs (the compute dtype, ``--precision``) and the dtype the parameters
are stored in (``param_dtype``: float32, or bf16 where a scorer is asked to halve the weights' memory,
``rbjax measure --param-dtype bf16``), and fixes everything else: gradients, optimiser state, accumulation, the
residual stream, norms, softmax, log-sum-exp and losses are float32 (the accumulation dtype) in every policy (the
model modules' precision contract, e.g. :class:`rbjax.model.gpt2.GPT2LMHeadModel`); training always stores float32
trained parameters (a frozen base under LoRA adapters may be stored in bf16, ``--param-dtype bf16``: the debiasing
losses read its embedding rows upcast to float32, and HD's bias-subspace SVD runs in float32). Both settings take
their names from the one table :data:`DTYPES` (``fp32``, ``bf16``), and the byte sizes every memory estimate uses
(:mod:`rbjax.model.memory`) are the policy's (:attr:`Policy.param_bytes`, ...).

``fp32`` means **full** fp32 on every backend: on a TPU an fp32 matmul defaults to one bf16 pass and on an
A100/H100 to TF32, so an "fp32" run there would silently compute in lower precision and no longer match PyTorch.
Every computation therefore traces its matmuls inside :meth:`Policy.matmul_context` (``"highest"``), whatever the
process-wide ``jax_default_matmul_precision`` says. ``bf16`` is always explicit (``--precision bf16``) and recorded
with the result; its matmuls take bf16 inputs and accumulate in float32 (``preferred_element_type``), and the
context is ``"highest"`` as well, so a float32 operand that reaches a bf16-policy matmul is not rounded further.

The model after jmp's ``Policy`` (param / compute / output dtypes), reduced to what rbjax varies.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Policy", "DTYPES", "PRECISIONS", "get_policy"]

#: the one dtype table: every dtype by the name the CLI, configs and results use (``--precision``, ``--param-dtype``)
DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16}
#: the accepted names, in the order help texts show them
PRECISIONS = tuple(DTYPES)


@dataclasses.dataclass(frozen=True)
class Policy:
    """A precision policy (hashable: usable as a static argument of ``jit``).

    Attributes:
        name: the compute precision, ``"fp32"`` or ``"bf16"`` (what results record as ``precision``).
        compute_dtype: the matmul input dtype.
        param_dtype: parameter storage: float32, except a scorer's ``param_dtype="bf16"`` (training keeps float32
            parameters and optimiser state).
        accum_dtype: matmul accumulation, activations between matmuls, gradients, optimiser state, losses
            (float32 in every policy).
        matmul_precision: the ``jax.default_matmul_precision`` every computation traces under.
    """

    name: str
    compute_dtype: Any
    param_dtype: Any = jnp.float32
    accum_dtype: Any = jnp.float32
    matmul_precision: str = "highest"

    def matmul_context(self):
        """Context manager pinning the matmul precision while a computation is traced (and run)."""
        return jax.default_matmul_precision(self.matmul_precision)

    def cast_for_storage(self, tree):
        """Floating leaves of ``tree`` (parameters as loaded) in the parameter-storage dtype, other leaves unchanged;
        ``tree`` itself when that is float32. Host arrays are cast on the host (no full-size copy on one device);
        arrays already split over a mesh are cast where they lie, each device its own slices."""
        dt = self.param_dtype
        if jnp.dtype(dt) == jnp.dtype(jnp.float32):
            return tree

        def cast(x):
            if isinstance(x, jax.Array) and not x.is_fully_replicated:
                return x.astype(dt) if jnp.issubdtype(x.dtype, jnp.floating) else x
            x = np.asarray(x)
            return x.astype(dt) if np.issubdtype(x.dtype, np.floating) else x

        return jax.tree.map(cast, tree)

    @property
    def is_full_precision(self) -> bool:
        return jnp.dtype(self.compute_dtype) == jnp.dtype(jnp.float32)

    @property
    def compute_bytes(self) -> int:
        """Bytes of one value in the compute dtype (matmul inputs; a generation's KV cache)."""
        return jnp.dtype(self.compute_dtype).itemsize

    @property
    def param_bytes(self) -> int:
        """Bytes of one stored parameter."""
        return jnp.dtype(self.param_dtype).itemsize

    @property
    def accum_bytes(self) -> int:
        """Bytes of one value in the accumulation dtype (gradients, optimiser moments, activations)."""
        return jnp.dtype(self.accum_dtype).itemsize


def get_policy(precision: str | Policy = "fp32", param_dtype: str = "fp32") -> Policy:
    """The :class:`Policy` of the compute precision ``precision`` and the parameter storage ``param_dtype`` (names
    of :data:`DTYPES`; a :class:`Policy` is returned as is).

    Raises:
        ValueError: an unknown name (the setting and the accepted names are said).
    """
    if isinstance(precision, Policy):
        return precision
    return Policy(precision, _dtype("precision", precision), param_dtype=_dtype("param_dtype", param_dtype))


def _dtype(setting: str, name: str):
    try:
        return DTYPES[name]
    except (KeyError, TypeError):
        raise ValueError(f"{setting} must be one of {list(PRECISIONS)}, got {name!r}") from None
