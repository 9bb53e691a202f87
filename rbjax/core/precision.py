"""One precision policy for every computation of rbjax (scoring, training, generation, DST/CRG).

A *policy* names the dtype of the matmul inputs (the compute dtype) and fixes everything else: parameters,
optimiser state, accumulation, the residual stream, norms, softmax, log-sum-exp and losses are float32 in every
policy (the model modules' precision contract, e.g. :class:`rbjax.model.gpt2.GPT2LMHeadModel`).

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

__all__ = ["Policy", "POLICIES", "PRECISIONS", "get_policy"]


@dataclasses.dataclass(frozen=True)
class Policy:
    """A precision policy (hashable: usable as a static argument of ``jit``).

    Attributes:
        name: ``"fp32"`` or ``"bf16"`` (what results record).
        compute_dtype: the matmul input dtype.
        param_dtype: parameters and optimiser state (float32 in every policy).
        accum_dtype: matmul accumulation, activations between matmuls, losses (float32 in every policy).
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

    def cast_for_compute(self, tree):
        """Floating leaves of ``tree`` (e.g. parameters) cast to the compute dtype; other leaves unchanged."""
        dt = self.compute_dtype
        return jax.tree.map(lambda x: x.astype(dt) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)

    @property
    def is_full_precision(self) -> bool:
        return jnp.dtype(self.compute_dtype) == jnp.dtype(jnp.float32)


#: every policy, by the name the CLI, configs and results use
POLICIES = {"fp32": Policy("fp32", jnp.float32), "bf16": Policy("bf16", jnp.bfloat16)}
#: the accepted names, in the order help texts show them
PRECISIONS = tuple(POLICIES)


def get_policy(precision: str | Policy) -> Policy:
    """The :class:`Policy` named ``precision`` (a :class:`Policy` is returned as is).

    Raises:
        ValueError: an unknown name (the accepted ones are listed).
    """
    if isinstance(precision, Policy):
        return precision
    try:
        return POLICIES[precision]
    except (KeyError, TypeError):
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}") from None
