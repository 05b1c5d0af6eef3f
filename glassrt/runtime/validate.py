"""Each node against its op's schema, when a model loads: how many inputs and outputs it is
given (omitted optional ones included, as written) and, for the ONNX domain, which
attributes. onnxruntime and the ONNX checker refuse such a model at load; glassrt did not
look, and a MatMul given a third input, or an attribute MatMul has no use for, ran on one
provider (whose kernel ignored it) and failed in another's with a TypeError."""
from __future__ import annotations

from ..errors import InvalidModelError, describe_node
from ..ops.registry import get_contract
from .select import NO_EFFECT_ATTRS

_ANY = (1 << 31) - 1  # onnx's max_input / max_output for a variadic op


def check_nodes(graph) -> None:
    """Raise InvalidModelError, naming the node, for the first node its schema refuses
    (subgraphs' nodes too)."""
    for node in graph.nodes:
        check_node(node)
        for sub in node.subgraphs():
            check_nodes(sub)


def check_node(node) -> None:
    contract = get_contract(node.domain, node.op_type, node.opset)
    if contract is None:
        return  # an op no provider knows: placement says so
    if contract.arity is not None:
        lo, hi, out_lo, out_hi = contract.arity
    elif contract.custom_schema is not None:  # glassrt's, contrib and users' ops: at most their
        # inputs unless the last repeats; fewer are left to their meta rules (the contrib
        # schemas mark inputs required that onnxruntime's optimizers leave out)
        schema = contract.custom_schema
        lo, hi, out_lo, out_hi = 0, _ANY if schema.variadic else len(schema.inputs), 0, _ANY
    else:
        return
    for what, n, a, b in (("inputs", len(node.inputs), lo, hi), ("outputs", len(node.outputs), out_lo, out_hi)):
        if not a <= n <= b:
            takes = str(a) if a == b else f"{a} to {b}" if b < _ANY else f"at least {a}"
            raise InvalidModelError(f"{describe_node(node)} has {n} {what}; {node.op_type} takes {takes}")
    if contract.attributes is not None and not node.domain:
        unknown = sorted(a for a in node.attrs if a not in contract.attributes and a not in NO_EFFECT_ATTRS)
        if unknown:
            takes = ", ".join(sorted(contract.attributes)) or "none"
            raise InvalidModelError(f"{describe_node(node)} has attribute(s) {', '.join(unknown)}, which "
                                    f"{node.op_type}-{contract.since_version} does not take (it takes: {takes})")
        for name, value in node.attrs.items():
            kind = contract.attributes.get(name)
            if kind is not None and not _of_type(value, kind):
                raise InvalidModelError(
                    f"{describe_node(node)} attribute '{name}' is {_described(value)}; {node.op_type}-"
                    f"{contract.since_version} takes {_ATTRIBUTE_TYPES.get(kind, kind)} (onnxruntime refuses it too)")


# AttributeProto's types, by number, and what a parsed attribute of each is (onnx_io: the
# values onnx.helper.get_attribute_value gives, strings decoded, graphs and tensors read)
_ATTRIBUTE_TYPES = {1: "a float", 2: "an int", 3: "a string", 4: "a tensor", 5: "a graph", 6: "floats",
                    7: "ints", 8: "strings", 9: "tensors", 10: "graphs", 11: "a sparse tensor",
                    12: "sparse tensors", 13: "a type", 14: "types"}
_SCALARS = {1: float, 2: int, 3: str}
_LISTS = {6: float, 7: int, 8: str}


def _of_type(value, kind: int) -> bool:
    """Whether a parsed attribute value is of AttributeProto type `kind` (lists: every item;
    an empty list is any list's). Tensors, graphs and types are left to what reads them."""
    if kind in _SCALARS:
        return type(value) is _SCALARS[kind]
    if kind in _LISTS:
        return isinstance(value, list) and all(type(v) is _LISTS[kind] for v in value)
    if kind in (9, 10, 12, 14):
        return isinstance(value, list)
    return value is not None


def _described(value) -> str:
    if value is None:
        return "of no type (UNDEFINED)"
    if isinstance(value, list):
        kinds = sorted({type(v).__name__ for v in value})
        return f"a list of {' and '.join(kinds)}"
    return f"{type(value).__name__} {value!r}"[:80]
