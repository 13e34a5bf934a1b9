"""One recorded op call's arguments, parsed: what every FLOP/byte model reads.

``record_shapes=True`` traces carry, per CPU op, ``Input Dims`` (one shape per positional
input: a list of ints for a tensor, ``[]`` for a scalar or None, a list of shapes for a
TensorList), ``Input type`` (``float``, ``c10::BFloat16``, ``Scalar``, ``ScalarList`` …) and
``Concrete Inputs`` (non-tensor arguments as text: ``"[1, 1]"``, ``"True"``, ``"-1"``, ``""``
for tensors and None) and ``Input Strides`` (a stride of 0 marks a dim that a view repeats: an
input read counts its stored elements, not its shape's). The loader keeps the four as JSON
text; :meth:`OpArgs.parse` reads them once per distinct signature.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

#: Bytes per element of the tensor dtypes ``Input type`` spells (``float4_e2m1fn_x2``: one
#: byte holds a pair). Anything not listed is not a tensor dtype (Scalar, ScalarList, "" …).
DTYPE_BYTES: dict[str, float] = {
    "double": 8, "float": 4, "c10::Half": 2, "c10::BFloat16": 2,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1,
    "c10::Float8_e8m0fnu": 1, "c10::Float4_e2m1fn_x2": 1,
    "long int": 8, "long": 8, "int": 4, "short int": 2, "short": 2, "signed char": 1, "unsigned char": 1,
    "bool": 1, "c10::complex<float>": 8, "c10::complex<double>": 16, "c10::complex<c10::Half>": 4,
    "unsigned int": 4, "unsigned long": 8, "unsigned short": 2,
}

#: Precision class of a floating or integer dtype: the key of the device's peak it is held to.
DTYPE_PRECISION: dict[str, str] = {
    "double": "fp64", "float": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8", "c10::Float4_e2m1fn_x2": "fp4", "signed char": "int8", "unsigned char": "int8",
    "c10::complex<float>": "fp32", "c10::complex<double>": "fp64",
}

#: ``torch.dtype`` codes (c10::ScalarType) as Concrete Inputs print them → bytes per element.
SCALAR_TYPE_BYTES: dict[int, float] = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 11: 1, 15: 2, 23: 1, 24: 1,
                                       25: 1, 26: 1}

_INTS = re.compile(r"-?\d+")


def numel(shape: Sequence[int]) -> int:
    """Number of elements of a shape (1 for a 0-dim tensor)."""
    return math.prod(shape)


@dataclass(frozen=True)
class OpArgs:
    """The positional inputs of one op call: ``dims``, ``types`` and ``concrete`` align by index."""

    name: str
    dims: tuple[Any, ...]
    types: tuple[str, ...]
    concrete: tuple[str, ...]
    strides: tuple[Any, ...] = ()

    @staticmethod
    def parse(name: str, dims: str | None, types: str | None, concrete: str | None,
              strides: str | None = None) -> OpArgs:
        """The arguments from the loader's JSON texts (a missing or unreadable one is empty)."""
        return OpArgs(name, _list(dims), tuple(str(t) for t in _list(types)), tuple(str(c) for c in _list(concrete)),
                      _list(strides))

    def dtype(self, i: int) -> str | None:
        """The dtype of input ``i`` when it is a tensor (else None)."""
        t = self.types[i] if 0 <= i < len(self.types) else None
        return t if t in DTYPE_BYTES else None

    def shape(self, i: int) -> tuple[int, ...] | None:
        """The shape of input ``i`` when it is a tensor with a flat list of dims (else None)."""
        if self.dtype(i) is None or i >= len(self.dims):
            return None
        d = self.dims[i]
        if isinstance(d, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in d):
            return tuple(d)
        return None

    def itemsize(self, i: int) -> float:
        """Bytes per element of input ``i`` (0 when it is not a tensor)."""
        t = self.dtype(i)
        return DTYPE_BYTES[t] if t is not None else 0.0

    def distinct(self, i: int) -> int | None:
        """Elements of tensor input ``i`` stored in memory: its numel, less the dims of stride 0 (a
        view made by ``expand``/broadcasting repeats one element along them); numel when the trace
        recorded no strides."""
        s = self.shape(i)
        if s is None:
            return None
        st = self.strides[i] if i < len(self.strides) else None
        if isinstance(st, list) and len(st) == len(s) and all(isinstance(v, int) for v in st):
            return numel([n for n, v in zip(s, st) if v != 0])
        return numel(s)

    def nbytes(self, i: int) -> float:
        """Bytes of tensor input ``i`` as stored (stride-0 dims counted once; 0 when not a tensor):
        what reading it moves."""
        n = self.distinct(i)
        return n * self.itemsize(i) if n is not None else 0.0

    def precision(self, i: int = 0) -> str | None:
        t = self.dtype(i)
        return DTYPE_PRECISION.get(t) if t is not None else None

    def text(self, i: int) -> str:
        return self.concrete[i].strip() if 0 <= i < len(self.concrete) else ""

    def flag(self, i: int) -> bool | None:
        """Concrete input ``i`` read as a bool (``True``/``False``/``1``/``0``), else None."""
        t = self.text(i).lower()
        return {"true": True, "1": True, "false": False, "0": False}.get(t)

    def ints(self, i: int) -> tuple[int, ...] | None:
        """Concrete input ``i`` read as a list of ints (``"[1, 1]"``, ``"2"``), else None."""
        t = self.text(i)
        if not t or not re.fullmatch(r"\[?\s*-?\d+(\s*,\s*-?\d+)*\s*,?\s*\]?|\[\s*\]", t):
            return None
        return tuple(int(x) for x in _INTS.findall(t))

    def int(self, i: int) -> int | None:
        v = self.ints(i)
        return v[0] if v is not None and len(v) == 1 and not self.text(i).startswith("[") else None


def _list(text: str | None) -> tuple[Any, ...]:
    if not text:
        return ()
    try:
        v = orjson.loads(text)
    except orjson.JSONDecodeError:
        return ()
    return tuple(v) if isinstance(v, list) else ()


def broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """The broadcast shape of ``shapes`` (None when they do not broadcast)."""
    n = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(1, n + 1):
        sizes = {s[-i] for s in shapes if len(s) >= i} - {1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return tuple(reversed(out))
