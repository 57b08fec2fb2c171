"""Sparse-update schemes: which parameters (and which of their output channels) to train.

A scheme maps glob patterns over parameter names or module names to a policy:
`full`, `frozen`, `bias` (the module's biases only) or a ratio r in (0, 1] (the first
ceil(r * C) output channels). Later patterns override earlier ones; parameters no pattern
names take `default` (frozen unless said otherwise).
"""

from __future__ import annotations

import difflib
import fnmatch
import json
import os
from dataclasses import dataclass, field

from pock_mlir.training import Policy


class SparseConfigError(ValueError):
    pass


@dataclass
class SparseUpdate:
    rules: list[tuple[str, object]] = field(default_factory=list)
    default: object = "frozen"

    @staticmethod
    def from_mapping(mapping: dict) -> SparseUpdate:
        mapping = dict(mapping)
        default = mapping.pop("default", "frozen")
        return SparseUpdate(rules=list(mapping.items()), default=default)


@dataclass
class SparseScheme:
    """The resolved scheme: a Policy for every parameter tensor."""

    policies: dict[str, Policy]
    source: str = "full"


def _policy_for(value, name: str, is_bias: bool, where: str) -> Policy:
    if isinstance(value, str):
        if value == "full":
            return Policy("full")
        if value == "frozen":
            return Policy("frozen")
        if value == "bias":
            return Policy("full") if is_bias else Policy("frozen")
        raise SparseConfigError(f"{where}: unknown policy '{value}'; use full, frozen, bias or a ratio in (0, 1]")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not 0 < value <= 1:
            raise SparseConfigError(f"{where}: channel ratio must be in (0, 1], got {value}")
        return Policy("full") if value == 1 else Policy("channels", float(value))
    raise SparseConfigError(f"{where}: a policy is full, frozen, bias or a number in (0, 1], got {value!r}")


def _load(sparse) -> SparseUpdate:
    if isinstance(sparse, SparseUpdate):
        return sparse
    if isinstance(sparse, dict):
        return SparseUpdate.from_mapping(sparse)
    if isinstance(sparse, (str, os.PathLike)) and os.path.exists(sparse):
        text = open(sparse).read()
        if str(sparse).endswith(".json"):
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
        if not isinstance(data, dict):
            raise SparseConfigError(f"{sparse}: expected a mapping of patterns to policies")
        return SparseUpdate.from_mapping(data)
    raise SparseConfigError(f"sparse= takes None, a dict, a SparseUpdate or a YAML/JSON path; got {sparse!r}")


def resolve_sparse(sparse, model, param_names: list[str]) -> SparseScheme:
    if sparse is None or sparse == "full":
        return SparseScheme({n: Policy("full") for n in param_names}, "full")
    scheme = _load(sparse)
    module_of = {n: n.rpartition(".")[0] for n in param_names}
    policies = {n: _policy_for(scheme.default, n, n.endswith("bias"), "default") for n in param_names}
    for pattern, value in scheme.rules:
        matched = [n for n in param_names if fnmatch.fnmatchcase(n, pattern) or fnmatch.fnmatchcase(module_of[n], pattern)]
        if not matched:
            close = difflib.get_close_matches(pattern, param_names + sorted(set(module_of.values())), n=5, cutoff=0.3)
            hint = f"; closest names: {', '.join(close)}" if close else f"; parameters are: {', '.join(param_names[:10])}"
            raise SparseConfigError(f"pattern '{pattern}' matches no parameter or module{hint}")
        for n in matched:
            policies[n] = _policy_for(value, n, n.endswith("bias"), f"pattern '{pattern}'")
    return SparseScheme(policies, "custom")
