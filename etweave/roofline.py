"""Roofline values: `num_ops` (FLOPs) and `tensor_size` (bytes moved) for every GPU node (docs/FACTS.md §A3).

ASTRA-sim's roofline mode times a GPU COMP_NODE as num_ops / perf(num_ops / tensor_size) and throws when either
attr is missing, so every COMP_NODE gets both; CPU nodes are replayed from `duration_micros` whatever they say.

Where the values come from: a GPU kernel, memcpy or memset belongs to the host op that launched it, found by
walking up from its runtime launch call through the ops enclosing it on its thread to the nearest op of a family
in `FAMILIES`. That op's work is computed from its host-ET input shapes and dtypes and spread over every GPU
event that belongs to it, by share of measured duration, as integers that sum to the op's total. A GPU event
with no family op above it (or whose op's shapes are not recorded) gets 0 for both; so does every CPU node.

Families (FLOPs; bytes = every tensor input and output, numel x dtype size, from the recorded shapes):
  matmul       mm, bmm: 2·M·K·N per batch; addmm, baddbmm, _addmm_activation: + M·N for the bias
  conv         cudnn/mkldnn/slow convolutions: 2 · numel(output) · (C_in/groups · kH · kW);
               convolution_backward: that, once per input/weight gradient in output_mask, + numel(grad) for bias
  elementwise  one FLOP per element of the largest output (or input), e.g. add, mul, relu, threshold_backward;
               _foreach_* ops: per element of their tensor lists; copies and fills: 0 FLOPs, their bytes
  normalize    batch/layer norm, softmax and pooling, forward and backward: a fixed FLOPs per input element
               (5 for a norm, 3 for softmax, 1 for pooling), an estimate of their arithmetic
  reduce       sum, mean, amax, max, norm: one FLOP per input element
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from math import prod
from typing import Any

import msgspec

from etweave.model import GPU_KINDS, OP_KINDS, Graph, Item, OpRecord
from etweave.read.host_et import IO
from etweave.read.widths import INT64_MAX

DTYPE_BYTES: dict[str, int] = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4, "short int": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
}
_TENSOR_TYPE = re.compile(r"Tensor\(([^()]*(?:\([^()]*\))?[^()]*)\)")


class Tensor(msgspec.Struct, frozen=True):
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES.get(self.dtype, 0)


def _is_shape(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in value)


def tensors_at(io: IO, pos: int) -> list[Tensor]:
    """The tensors of input/output position `pos` (one for a Tensor, several for a list of tensors)."""
    if pos >= len(io.types) or pos >= len(io.shapes):
        return []
    typ, shape = io.types[pos], io.shapes[pos]
    if not isinstance(typ, str):
        return []
    dtypes = _TENSOR_TYPE.findall(typ)
    if not dtypes:
        return []
    shapes = [shape] if typ.startswith("Tensor(") else shape if isinstance(shape, list) else []
    return [Tensor(tuple(s), d) for s, d in zip(shapes, dtypes, strict=False)
            if _is_shape(s) and d in DTYPE_BYTES]


def _all_tensors(io: IO) -> Iterator[Tensor]:
    for pos in range(len(io.types)):
        yield from tensors_at(io, pos)


def _first(io: IO, pos: int) -> Tensor | None:
    ts = tensors_at(io, pos)
    return ts[0] if ts else None


def _largest_numel(op: OpRecord) -> int:
    out = [t.numel for t in _all_tensors(op.outputs)]
    return max(out) if out else max((t.numel for t in _all_tensors(op.inputs)), default=0)


def _matmul(a_pos: int, bias: bool) -> Callable[[OpRecord], int | None]:
    def flops(op: OpRecord) -> int | None:
        a, b = _first(op.inputs, a_pos), _first(op.inputs, a_pos + 1)
        if a is None or b is None or len(a.shape) < 2 or len(a.shape) != len(b.shape):
            return None
        *batch, m, k = a.shape
        n = b.shape[-1]
        return prod(batch) * m * n * (2 * k + (1 if bias else 0))
    return flops


def _conv_forward(op: OpRecord) -> int | None:
    weight, out = _first(op.inputs, 1), _first(op.outputs, 0)
    if weight is None or out is None or len(weight.shape) < 3:
        return None
    return 2 * out.numel * prod(weight.shape[1:])


def _conv_backward(op: OpRecord) -> int | None:
    # convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    #                      output_padding, groups, output_mask)
    grad, inp, weight = _first(op.inputs, 0), _first(op.inputs, 1), _first(op.inputs, 2)
    if grad is None or inp is None or weight is None or len(weight.shape) < 3:
        return None
    values = op.inputs.values
    transposed = len(values) > 7 and values[7] is True
    mask = values[10] if len(values) > 10 and isinstance(values[10], list) else [True, True, True]
    per_gradient = 2 * (inp.numel if transposed else grad.numel) * prod(weight.shape[1:])
    wanted = [bool(x) for x in mask[:3]] + [True] * (3 - len(mask[:3]))
    return per_gradient * (wanted[0] + wanted[1]) + (grad.numel if wanted[2] else 0)


def _per_element(factor: int, of_input: bool = False) -> Callable[[OpRecord], int | None]:
    def flops(op: OpRecord) -> int | None:
        if of_input:
            first = _first(op.inputs, 0)
            return factor * first.numel if first is not None else None
        return factor * _largest_numel(op)
    return flops


def _foreach(op: OpRecord) -> int | None:
    return sum(t.numel for t in tensors_at(op.inputs, 0))


_ELEMENTWISE = (
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "neg", "abs", "exp", "log", "sqrt", "rsqrt",
    "pow", "relu", "relu_", "clamp", "clamp_", "clamp_min", "clamp_min_", "clamp_max", "threshold",
    "threshold_backward", "sigmoid", "sigmoid_backward", "tanh", "tanh_backward", "gelu", "gelu_backward", "silu",
    "silu_backward", "hardtanh", "hardtanh_backward", "leaky_relu", "addcmul", "addcmul_", "addcdiv", "addcdiv_",
    "lerp_", "exp_", "log_", "sqrt_", "neg_", "sigmoid_", "tanh_",
    "where", "masked_fill", "masked_fill_", "eq", "ne", "lt", "gt", "le", "ge", "reciprocal",
    "dropout", "native_dropout", "native_dropout_backward", "embedding_dense_backward", "index_select",
)
_MOVES = ("copy_", "fill_", "zero_", "_to_copy", "clone", "contiguous", "cat", "index", "gather", "scatter_",
          "embedding", "index_put_", "_index_put_impl_")
_NORMS = ("native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm", "native_batch_norm_backward",
          "cudnn_batch_norm_backward", "miopen_batch_norm_backward", "native_layer_norm",
          "native_layer_norm_backward", "native_group_norm", "native_group_norm_backward")
_SOFTMAX = ("_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data",
            "nll_loss_forward", "nll_loss_backward")
_POOLING = ("max_pool2d_with_indices", "max_pool2d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward",
            "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward", "adaptive_max_pool2d")
_REDUCE = ("sum", "mean", "amax", "amin", "max", "min", "norm", "linalg_vector_norm")

# op name -> FLOPs from its shapes (None when the shapes are not there). One table: a new op is one entry.
FAMILIES: dict[str, tuple[str, Callable[[OpRecord], int | None]]] = {
    "aten::mm": ("matmul", _matmul(0, bias=False)),
    "aten::bmm": ("matmul", _matmul(0, bias=False)),
    "aten::addmm": ("matmul", _matmul(1, bias=True)),
    "aten::baddbmm": ("matmul", _matmul(1, bias=True)),
    "aten::_addmm_activation": ("matmul", _matmul(1, bias=True)),
    "aten::cudnn_convolution": ("conv", _conv_forward),
    "aten::miopen_convolution": ("conv", _conv_forward),
    "aten::mkldnn_convolution": ("conv", _conv_forward),
    "aten::_slow_conv2d_forward": ("conv", _conv_forward),
    "aten::_nnpack_spatial_convolution": ("conv", _conv_forward),
    "aten::convolution_backward": ("conv", _conv_backward),
    **{f"aten::{name}": ("elementwise", _per_element(1)) for name in _ELEMENTWISE},
    **{f"aten::{name}": ("elementwise", _per_element(0)) for name in _MOVES},
    **{f"aten::{name}": ("normalize", _per_element(5, of_input=True)) for name in _NORMS},
    **{f"aten::{name}": ("normalize", _per_element(3, of_input=True)) for name in _SOFTMAX},
    **{f"aten::{name}": ("normalize", _per_element(1, of_input=True)) for name in _POOLING},
    **{f"aten::{name}": ("reduce", _per_element(1, of_input=True)) for name in _REDUCE},
}


class Work(msgspec.Struct, frozen=True):
    flops: int
    bytes: int


def op_work(name: str, op: OpRecord) -> Work | None:
    """The FLOPs and bytes moved of op `name`, or None when it is in no family or its shapes are not recorded."""
    family = FAMILIES.get(name)
    if family is None and name.startswith("aten::_foreach_"):
        family = ("elementwise", _foreach)
    if family is None:
        return None
    flops = family[1](op)
    nbytes = sum(t.nbytes for t in _all_tensors(op.inputs)) + sum(t.nbytes for t in _all_tensors(op.outputs))
    if flops is None or nbytes <= 0:
        return None
    if flops > INT64_MAX or nbytes > INT64_MAX:  # corrupt shapes: no count the output could hold, so none
        return None
    return Work(flops, nbytes)


def _family_op(g: Graph, it: Item, cache: dict[int, int | None]) -> int | None:
    """Id of the nearest op with a family enclosing the runtime call that launched GPU item `it`."""
    if it.launcher is None:
        return None
    launcher = g.by_id.get(it.launcher)
    start = launcher.enclosing if launcher is not None else None
    walked: list[int] = []
    found: int | None = None
    current = start
    while current is not None:
        if current in cache:
            found = cache[current]
            break
        walked.append(current)
        op = g.by_id[current]
        if op.host is not None and (op.name in FAMILIES or op.name.startswith("aten::_foreach_")):
            found = current
            break
        current = op.enclosing
    for w in walked:
        cache[w] = found
    return found


def spread(total: int, weights: list[float]) -> list[int]:
    """`total` split in proportion to `weights` as integers summing to it (largest remainder; ties by position).
    Equal shares when every weight is 0."""
    if not weights:
        return []
    # integer arithmetic throughout (weights in ns): float shares of a large total round past it
    ints = [max(0, round(w * 1000)) for w in weights]
    if sum(ints) <= 0:
        ints = [1] * len(ints)
    scale = sum(ints)
    shares = [total * w // scale for w in ints]
    left = total - sum(shares)  # 0 <= left < len(weights)
    order = sorted(range(len(ints)), key=lambda i: (-((total * ints[i]) % scale), i))
    for i in order[:left]:
        shares[i] += 1
    return shares


def _any_io(g: Graph) -> bool:
    """Whether any op's host record has an input or an output (the first found ends the search)."""
    for it in g.of_kinds(OP_KINDS):
        h = it.host
        if h is not None and (h.inputs.types or h.outputs.types):
            return True
    return False


class Roofline(msgspec.Struct):
    values: dict[int, tuple[int, int]]  # item id -> (num_ops, tensor_size); items absent get 0, 0
    gpu_time_us: float  # all GPU events
    gpu_time_covered_us: float  # GPU events with real values
    ops: dict[str, int]  # family -> host ops whose work was spread over their GPU events


def assign(g: Graph) -> Roofline:
    """Every GPU event's share of its launching op's work (see the module docstring)."""
    cache: dict[int, int | None] = {}
    events_of: dict[int, list[Item]] = {}
    gpu_time = 0.0
    # no op's work is known without a recorded input or output (`op_work` counts their bytes): the walks from each
    # GPU event up to its op are skipped (a Kineto trace recorded without shapes)
    shapes = _any_io(g)
    for it in g.of_kinds(GPU_KINDS):
        if it.comm is not None:
            continue
        gpu_time += it.dur
        op_id = _family_op(g, it, cache) if shapes else None
        if op_id is not None:
            events_of.setdefault(op_id, []).append(it)
    values: dict[int, tuple[int, int]] = {}
    covered = 0.0
    ops: dict[str, int] = {}
    # an op's work is a function of its name and IO: ops that share their IO objects (the Kineto cpu ops without
    # shapes share one) share it, computed once (ids of objects alive throughout)
    work_of: dict[tuple[str, int, int], Work | None] = {}
    for op_id in sorted(events_of):
        op = g.by_id[op_id]
        h = op.host
        if h is None:
            continue
        key = (op.name, id(h.inputs), id(h.outputs))
        work = work_of[key] if key in work_of else work_of.setdefault(key, op_work(op.name, h))
        if work is None:
            continue
        events = events_of[op_id]
        weights = [max(0.0, e.dur) for e in events]
        for e, f, b in zip(events, spread(work.flops, weights), spread(work.bytes, weights), strict=True):
            values[e.id] = (f, b)
        covered += sum(weights)
        family = FAMILIES[op.name][0] if op.name in FAMILIES else "elementwise"
        ops[family] = ops.get(family, 0) + 1
    return Roofline(values, gpu_time, covered, dict(sorted(ops.items())))
