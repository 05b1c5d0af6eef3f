"""`glassrt compare MODEL --against onnxruntime`: the first node where glassrt and
onnxruntime disagree.

Both runtimes must expose the same intermediate values under the same names, so both run
the model's own nodes as written:

- glassrt at graph_optimization_level "none" with constant folding off: no pass rewrites,
  fuses or folds a node, so every node runs as a step of its own and every value keeps
  its ONNX name (only composites no provider runs whole are expanded, and their internal
  values have names of their own that onnxruntime does not know; they are skipped).
- onnxruntime at ORT_DISABLE_ALL on its CPUExecutionProvider, with every intermediate
  value added as a graph output. At its default level onnxruntime fuses Conv+Relu,
  folds constants and so on, and a value fused away cannot be an output; and a level that
  fused would blame a fused kernel on the first node of the chain.

Values are then walked in the original model's node order (ONNX requires it to be a
topological order, and both runtimes execute in one): the first node with an output that
differs beyond rtol/atol is the answer. Its inputs that both runtimes computed were
compared before it and agreed; inputs that could not be compared (a value only one side
has) are listed with it, so "its inputs agree" is never claimed without being checked.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace

import numpy as np
import onnx

from ..errors import GlassrtError
from .compare import ATOL, RTOL, Disagreement, all_values, value_difference

ORT_LEVEL = "ORT_DISABLE_ALL"
ORT_PROVIDER = "CPUExecutionProvider"
GLASSRT_LEVEL = "none"
TWO_GIB = 2 << 30  # protobuf's limit on one serialized message


class OnnxruntimeError(GlassrtError):
    """onnxruntime is missing or cannot load or run the model (with its own message)."""


@dataclass
class CrossDisagreement(Disagreement):
    unchecked_inputs: tuple = ()  # inputs of the node that only one runtime exposed

    def __str__(self):
        text = super().__str__()
        if self.unchecked_inputs:
            text += f" (inputs not compared: {', '.join(self.unchecked_inputs)})"
        return text


@dataclass
class CrossResult:
    found: CrossDisagreement | None
    compared: int
    skipped: list = field(default_factory=list)  # (value, why) not compared
    glassrt_side: str = ""
    onnxruntime_side: str = ""


def _ort():
    try:
        import onnxruntime
    except ImportError as e:
        raise OnnxruntimeError("compare --against onnxruntime needs onnxruntime: pip install 'glassrt[compare]'") from e
    return onnxruntime


def _full_proto(model) -> onnx.ModelProto:
    """The model with its external data read in (onnxruntime gets it as bytes, with no
    folder to resolve relative paths from). glassrt's own loader has checked those paths
    before this runs: a model that reads outside its folder never gets here."""
    from ..onnx_io import read_model

    proto, where = read_model(model)
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    if where and any(t.data_location == onnx.TensorProto.EXTERNAL for t in copy.graph.initializer):
        onnx.external_data_helper.load_external_data_for_model(copy, where)
    return copy


def _with_outputs(proto: onnx.ModelProto, names: list) -> bytes:
    """Bytes of the model with `names` added as graph outputs, untyped: onnxruntime infers
    their types itself, so a value glassrt typed wrongly still loads (and then disagrees)."""
    have = {o.name for o in proto.graph.output}
    proto.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in have)
    if proto.ByteSize() >= TWO_GIB:
        raise OnnxruntimeError(f"the model is {proto.ByteSize():,} bytes with its external data: over protobuf's "
                               "2 GiB, so it cannot be handed to onnxruntime in one piece")
    return proto.SerializeToString()


def _run_ort(data: bytes, feeds: dict, names: list, threads: int) -> tuple[dict, str]:
    ort = _ort()
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, ORT_LEVEL)
    so.log_severity_level = 3  # its warnings about unused initializers would bury the answer
    if threads:
        so.intra_op_num_threads = threads
    try:
        sess = ort.InferenceSession(data, so, providers=[ORT_PROVIDER])
    except Exception as e:  # noqa: BLE001 — onnxruntime's own exception types (Fail, InvalidGraph...)
        raise OnnxruntimeError(f"onnxruntime {ort.__version__} cannot load the model: {e}") from e
    declared = {i.name for i in sess.get_inputs()}
    try:
        values = sess.run(names, {k: v for k, v in feeds.items() if k in declared})
    except Exception as e:  # noqa: BLE001
        raise OnnxruntimeError(f"onnxruntime {ort.__version__} cannot run the model: {e}") from e
    side = f"onnxruntime {ort.__version__} {ORT_PROVIDER}"
    return dict(zip(names, values)), side


def glassrt_options(base=None):
    """The compare session's options: the caller's (threads...) with every rewrite off."""
    from ..runtime.options import SessionOptions

    opts = replace(base) if base is not None else SessionOptions()
    opts.graph_optimization_level = GLASSRT_LEVEL
    opts.constant_folding = False
    return opts


def first_divergence(model, feeds: dict, providers, rtol=RTOL, atol=ATOL, sess_options=None,
                     threads: int = 0) -> CrossResult:
    """Run `model` in glassrt (on `providers`) and in onnxruntime, keeping every value, and
    name the first node, in the model's order, whose output differs beyond tolerance."""
    from ..session import Session as InferenceSession

    opts = glassrt_options(sess_options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sess = InferenceSession(model, providers=list(providers), fallback="warn", sess_options=opts)
    env, steps = all_values(sess, feeds)
    kernel = {o: st.kernel.name for st in steps for o in st.node.outputs if o}

    proto = _full_proto(model)
    nodes = list(proto.graph.node)
    skipped, names = [], []
    for node in nodes:
        for o in node.output:
            if not o:
                continue
            if not isinstance(env.get(o), np.ndarray):
                skipped.append((o, "glassrt has no tensor of that name (a sequence, or a value its passes "
                                   "replaced)" if o not in env else "not a tensor"))
                continue
            names.append(o)
    ours = sess._check_feeds(feeds)
    theirs, ort_side = _run_ort(_with_outputs(proto, names), ours, names, threads)

    known = {i.name for i in proto.graph.input} | {t.name for t in proto.graph.initializer}
    compared, agreed = 0, set(known)
    for node in nodes:
        for o in node.output:
            if o not in theirs:
                continue
            a, b = env[o], theirs[o]
            if not isinstance(b, np.ndarray):
                skipped.append((o, "onnxruntime returned no tensor for it"))
                continue
            compared += 1
            diff = value_difference(a, b, rtol, atol)
            if diff is None:
                agreed.add(o)
                continue
            unchecked = tuple(i for i in node.input if i and i not in agreed)
            found = CrossDisagreement(node.name or f"(unnamed, output '{o}')", node.op_type, o,
                                      kernel.get(o, "computed when glassrt planned (from shapes alone)"),
                                      f"{ort_side} ({ORT_LEVEL})", *diff, unchecked_inputs=unchecked)
            return CrossResult(found, compared, skipped, _glassrt_side(providers), f"{ort_side}, {ORT_LEVEL}")
    return CrossResult(None, compared, skipped, _glassrt_side(providers), f"{ort_side}, {ORT_LEVEL}")


def _glassrt_side(providers) -> str:
    from importlib.metadata import version

    return f"glassrt {version('glassrt')} on {','.join(providers)}, graph_optimization_level={GLASSRT_LEVEL}, " \
           "constant_folding off"


def render(result: CrossResult, console, rtol: float, atol: float) -> None:
    """The two sides, then the divergence as a table (values are data, never markup)."""
    from rich.table import Table

    from .compare import verdict

    console.print(f"glassrt:     {result.glassrt_side}", highlight=False, markup=False)
    console.print(f"onnxruntime: {result.onnxruntime_side} (every intermediate value added as a graph output)",
                  highlight=False, markup=False)
    d = result.found
    if d is not None:
        t = Table(title="first node whose outputs differ (its inputs agree)", title_justify="left")
        for col in ("", "value"):
            t.add_column(col, overflow="fold")
        rows = [("node", d.node), ("op", d.op), ("output", d.value), ("glassrt kernel", d.kernel_a),
                ("onnxruntime", d.kernel_b), ("max abs error", f"{d.max_abs:.4g}"),
                ("max rel error", f"{d.max_rel:.4g}"), ("first element over tolerance", str(d.where)),
                ("glassrt there", repr(d.a)), ("onnxruntime there", repr(d.b))]
        if d.unchecked_inputs:
            rows.append(("inputs not compared", ", ".join(d.unchecked_inputs)))
        from rich.text import Text

        for k, v in rows:
            t.add_row(k, Text(v))
        console.print(t)
    console.print(verdict(d, result.compared, rtol, atol), style="green" if d is None else "bold red",
                  highlight=False, markup=False)
