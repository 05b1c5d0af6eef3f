"""The models `glassrt bench` and benchmarks/suite.py measure, built here with onnx.helper.

Nothing is downloaded and torch is not needed: every weight is seeded random float32.

- `light(name, batch)`: the nine light CNNs of the onnx package, ConstantOfShape weights
  made random (`light_models.randomize_weights`), the batch dim rewritten.
- `mobilenet()`: a MobileNetV2 (inverted residuals, ReLU6 as Clip, depthwise 3x3 convs,
  3.5 M parameters) as torchvision's model exports with BatchNormalization folded.
- `bert()`: a BERT-base encoder node for node as torch.onnx.export (TorchScript
  exporter, opset 17) writes Hugging Face's eager BertModel: views through
  Shape/Gather/Unsqueeze/Concat/Reshape, the extended mask (1 - mask) * -10000,
  Erf-based GELU, LayerNormalization, a tanh pooler.
- `gpt2()`: a GPT-2 step with a KV cache, as the same exporter writes Hugging Face's
  GPT2LMHeadModel (with nn.Linear for its Conv1D): packed QKV Split, past/present
  Concat, causal mask sliced from a per-layer boolean Constant and applied with Where,
  tanh GELU (gelu_new), the LM head tied to the token embedding (a transposed copy).

`SUITE` maps the names the command line accepts (`light:resnet50`, `mobilenet`,
`bert-base`, `gpt2-step`) to a builder, default dims and an input generator.
"""
from __future__ import annotations

import collections
import itertools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from . import light_models

OPSET = 17
IR_VERSION = 8  # what torch's exporter writes at opset 17
BERT_VOCAB = 30522  # bert-base-uncased's; its embedding is 94 MB of the model's 440
GPT2_VOCAB = 50257  # GPT-2's; with the LM head's transposed copy, 2 x 154 MB of the model's 650


class _Graph:
    """Nodes and initializers of one graph, named the way torch's TorchScript exporter names
    them ('/scope/Op_k_output_0', k counting that op type in that scope), so that a model
    built here reads like an exported one in explain/profile tables."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._counts = collections.Counter()
        self._weight_ids = itertools.count(100)

    def op(self, op_type, inputs, scope="", outputs=1, name=None, **attrs):
        k = self._counts[(scope, op_type)]
        self._counts[(scope, op_type)] += 1
        base = f"{scope}/{op_type}" + (f"_{k}" if k else "")
        outs = [name] if name else [f"{base}_output_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=base, **attrs))
        return outs[0] if outputs == 1 else outs

    def const(self, value, scope="", dtype=None):
        """A Constant node, as the exporter writes every literal (not an initializer)."""
        array = np.asarray(value, dtype=dtype)
        return self.op("Constant", [], scope, value=numpy_helper.from_array(array))

    def initializer(self, name, array):
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def random(self, shape, std):
        return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    def weight(self, name, shape, std):
        return self.initializer(name, self.random(shape, std))

    def matmul_weight(self, shape, std):
        """A Linear's weight: the exporter folds W.T into an initializer named onnx::MatMul_N."""
        return self.weight(f"onnx::MatMul_{next(self._weight_ids)}", shape, std)

    def layer_norm_params(self, param, width):
        scale = self.initializer(f"{param}.weight", 1 + self.random((width,), 0.05))
        bias = self.initializer(f"{param}.bias", self.random((width,), 0.05))
        return scale, bias

    def model(self, name, inputs, outputs, doc=""):
        graph = helper.make_graph(self.nodes, name, inputs, outputs, initializer=self.initializers)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                                 producer_name="glassrt.tools.bench_models", doc_string=doc)


# ---------------------------------------------------------------- layers as exported


def _linear(g: _Graph, x, d_in, d_out, scope, param, std=0.02, bias=True):
    """nn.Linear: MatMul by the transposed weight, then Add(bias, product) in that order."""
    y = g.op("MatMul", [x, g.matmul_weight((d_in, d_out), std)], scope)
    if bias:
        y = g.op("Add", [g.weight(f"{param}.bias", (d_out,), std), y], scope)
    return y


def _layer_norm(g: _Graph, x, width, scope, param, eps, name=None):
    scale, bias = g.layer_norm_params(param, width)
    return g.op("LayerNormalization", [x, scale, bias], scope, name=name, axis=-1, epsilon=eps)


def _dim(g: _Graph, x, index, scope):
    """x.size(index) as the exporter writes it: Shape, Constant, Gather (a scalar)."""
    return g.op("Gather", [g.op("Shape", [x], scope), g.const(index, scope, np.int64)], scope, axis=0)


def _view(g: _Graph, x, tail, scope):
    """x.view(x.size(0), x.size(1), *tail): the leading sizes read at run time (both Shape/Gather
    pairs first, then their Unsqueezes, in the exporter's order), the rest literal."""
    sizes = [_dim(g, x, i, scope) for i in range(2)]
    lead = [g.op("Unsqueeze", [s, g.const([0], scope, np.int64)], scope) for s in sizes]
    shape = g.op("Concat", [*lead, *[g.const([t], scope, np.int64) for t in tail]], scope, axis=0)
    return g.op("Reshape", [x, shape], scope, allowzero=0)


def _split_heads(g: _Graph, x, heads, head_dim, scope, transpose=True):
    """x.view(B, S, heads, head_dim).permute(0, 2, 1, 3); without the permute for BERT's key,
    whose permute and transpose(-1, -2) the exporter merges into one Transpose later."""
    y = _view(g, x, [heads, head_dim], scope)
    return g.op("Transpose", [y], scope, perm=[0, 2, 1, 3]) if transpose else y


def _merge_heads(g: _Graph, ctx, hidden, scope):
    """ctx.permute(0, 2, 1, 3).view(B, S, hidden)."""
    t = g.op("Transpose", [ctx], scope, perm=[0, 2, 1, 3])
    return _view(g, t, [hidden], scope)


def _size_from_end(g: _Graph, x, index, scope):
    """x.size(-k) as the exporter writes it with negative indices: Shape, Slice, Squeeze."""
    shape = g.op("Shape", [x], scope)
    axes = g.const([0], scope, np.int64)
    start = g.const([index], scope, np.int64)
    end = g.const([index + 1 if index < -1 else np.iinfo(np.int64).max], scope, np.int64)
    return g.op("Squeeze", [g.op("Slice", [shape, start, end, axes], scope), g.const([0], scope, np.int64)], scope)


# ---------------------------------------------------------------- BERT


def bert(layers=12, hidden=768, heads=12, intermediate=3072, vocab=BERT_VOCAB, max_positions=512,
         seed=0) -> onnx.ModelProto:
    """A BERT-base-shaped encoder (110 M parameters at the defaults) as torch.onnx.export
    writes Hugging Face's BertModel at opset 17: inputs input_ids, attention_mask,
    token_type_ids (int64, [batch, sequence]); outputs last_hidden_state and pooler_output."""
    g = _Graph(seed)
    head_dim = hidden // heads
    std = 0.02  # BERT's initializer_range

    # embeddings: word + token type, then position (position_ids[:, :seq]), LayerNorm
    g.initializer("position_ids", np.arange(max_positions, dtype=np.int64)[None])
    word = g.weight("embeddings.word_embeddings.weight", (vocab, hidden), std)
    pos = g.weight("embeddings.position_embeddings.weight", (max_positions, hidden), std)
    tok = g.weight("embeddings.token_type_embeddings.weight", (2, hidden), std)
    seq = g.op("Gather", [g.op("Shape", ["input_ids"]), g.const(1, dtype=np.int64)], axis=0)
    zero = g.const(0, dtype=np.int64)  # the exporter hoists this one; the pooler's Gather uses it
    axes, starts = g.const([1], dtype=np.int64), g.const([0], dtype=np.int64)
    ends = g.op("Unsqueeze", [seq, g.const([0], dtype=np.int64)])
    positions = g.op("Slice", ["position_ids", starts, ends, axes, g.const([1], dtype=np.int64)])
    x = g.op("Add", [g.op("Gather", [word, "input_ids"], "/embeddings/word_embeddings"),
                     g.op("Gather", [tok, "token_type_ids"], "/embeddings/token_type_embeddings")], "/embeddings")
    x = g.op("Add", [x, g.op("Gather", [pos, positions], "/embeddings/position_embeddings")], "/embeddings")
    x = _layer_norm(g, x, hidden, "/embeddings/LayerNorm", "embeddings.LayerNorm", 1e-12)

    # extended mask: attention_mask[:, None, None, :], (1.0 - mask) * -10000.0
    m = g.op("Unsqueeze", ["attention_mask", g.const([1], dtype=np.int64)])
    m = g.op("Unsqueeze", [m, g.const([2], dtype=np.int64)])
    m = g.op("Cast", [m], to=TensorProto.FLOAT)
    m = g.op("Sub", [g.const(1.0, dtype=np.float32), m])
    mask = g.op("Mul", [m, g.const(-10000.0, dtype=np.float32)])

    for i in range(layers):
        x = _bert_layer(g, x, mask, i, hidden, heads, head_dim, intermediate, std,
                        name="last_hidden_state" if i == layers - 1 else None)

    first = g.op("Gather", [x, zero], axis=1)  # hidden_states[:, 0]
    pooled = g.op("Gemm", [first, g.weight("pooler.dense.weight", (hidden, hidden), std),
                           g.weight("pooler.dense.bias", (hidden,), std)], "/pooler/dense", transB=1)
    g.op("Tanh", [pooled], "/pooler/activation", name="pooler_output")

    ints = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
            for n in ("input_ids", "attention_mask", "token_type_ids")]
    outs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", hidden]),
            helper.make_tensor_value_info("pooler_output", TensorProto.FLOAT, ["batch", hidden])]
    return g.model("bert", ints, outs, doc=f"BERT encoder: {layers} layers, hidden {hidden}, {heads} heads, "
                                           f"FFN {intermediate}, vocab {vocab} (random weights)")


def _bert_layer(g, x, mask, i, hidden, heads, head_dim, intermediate, std, name=None):
    s = f"/encoder/layer.{i}"
    p = f"encoder.layer.{i}"
    att = f"{s}/attention/self"
    q = _split_heads(g, _linear(g, x, hidden, hidden, f"{att}/query", f"{p}.attention.self.query", std),
                     heads, head_dim, att)
    k = _split_heads(g, _linear(g, x, hidden, hidden, f"{att}/key", f"{p}.attention.self.key", std),
                     heads, head_dim, att, transpose=False)
    v = _split_heads(g, _linear(g, x, hidden, hidden, f"{att}/value", f"{p}.attention.self.value", std),
                     heads, head_dim, att)
    # key.permute(0, 2, 1, 3).transpose(-1, -2): the exporter fuses both into one Transpose
    kt = g.op("Transpose", [k], att, perm=[0, 2, 3, 1])
    scores = g.op("Div", [g.op("MatMul", [q, kt], att), g.const(math.sqrt(head_dim), att, np.float32)], att)
    probs = g.op("Softmax", [g.op("Add", [scores, mask], att)], att, axis=-1)
    ctx = _merge_heads(g, g.op("MatMul", [probs, v], att), hidden, att)
    out = f"{s}/attention/output"
    y = _linear(g, ctx, hidden, hidden, f"{out}/dense", f"{p}.attention.output.dense", std)
    x = _layer_norm(g, g.op("Add", [y, x], out), hidden, f"{out}/LayerNorm", f"{p}.attention.output.LayerNorm", 1e-12)
    h = _linear(g, x, hidden, intermediate, f"{s}/intermediate/dense", f"{p}.intermediate.dense", std)
    h = _gelu_erf(g, h, f"{s}/intermediate/intermediate_act_fn")
    y = _linear(g, h, intermediate, hidden, f"{s}/output/dense", f"{p}.output.dense", std)
    return _layer_norm(g, g.op("Add", [y, x], f"{s}/output"), hidden, f"{s}/output/LayerNorm",
                       f"{p}.output.LayerNorm", 1e-12, name=name)


def _gelu_erf(g, x, scope):
    """F.gelu as the exporter writes it below opset 20: x * 0.5 * (1 + erf(x / sqrt(2)))."""
    e = g.op("Erf", [g.op("Div", [x, g.const(math.sqrt(2.0), scope, np.float32)], scope)], scope)
    y = g.op("Mul", [x, g.op("Add", [e, g.const(1.0, scope, np.float32)], scope)], scope)
    return g.op("Mul", [y, g.const(0.5, scope, np.float32)], scope)


def bert_feeds(batch: int, sequence: int, vocab: int = BERT_VOCAB, seed: int = 0) -> dict:
    """Token ids anywhere in the vocabulary; rows padded to different lengths (each row keeps
    at least half its tokens) so that the mask matters; two segments per row."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max(1, sequence // 2), sequence + 1, batch)
    lengths[0] = sequence  # one full row
    positions = np.arange(sequence)
    return {"input_ids": rng.integers(0, vocab, (batch, sequence), dtype=np.int64),
            "attention_mask": (positions[None] < lengths[:, None]).astype(np.int64),
            "token_type_ids": (positions[None] >= (lengths[:, None] // 2)).astype(np.int64)}


# ---------------------------------------------------------------- GPT-2 step with a KV cache


def gpt2(layers=12, hidden=768, heads=12, vocab=GPT2_VOCAB, max_positions=1024, seed=0) -> onnx.ModelProto:
    """A GPT-2 (124 M parameters at the defaults, plus the LM head's transposed copy of the
    token embedding, 163 M stored) decoder with a KV cache as torch.onnx.export writes it:
    inputs input_ids [batch, sequence] and past_key_values.{i}.key/value
    [batch, heads, past_sequence, head_dim]; outputs logits [batch, sequence, vocab] and
    present.{i}.key/value [batch, heads, past_sequence + sequence, head_dim]. One token per
    call is the decode step; a longer sequence with an empty past is the prompt."""
    g = _Graph(seed)
    head_dim = hidden // heads
    std = 0.02
    wte = g.rng.standard_normal((vocab, hidden), dtype=np.float32) * np.float32(std)
    g.initializer("transformer.wte.weight", wte)
    wpe = g.weight("transformer.wpe.weight", (max_positions, hidden), 0.01)

    # position_ids = arange(past, past + seq)
    past_len = _size_from_end(g, "past_key_values.0.key", -2, "")
    seq = _size_from_end(g, "input_ids", -1, "")
    total = g.op("Add", [seq, past_len])
    start, end = (g.op("Cast", [v], to=TensorProto.INT64) for v in (past_len, total))
    positions = g.op("Range", [start, end, g.const(1, dtype=np.int64)])
    positions = g.op("Unsqueeze", [positions, g.const([0], dtype=np.int64)])
    x = g.op("Add", [g.op("Gather", ["transformer.wte.weight", "input_ids"], "/transformer/wte"),
                     g.op("Gather", [wpe, positions], "/transformer/wpe")], "/transformer")
    # the attention's tril buffer: one Constant, made in the first layer and read by all
    # (the exporter deduplicates the layers' identical buffers)
    causal = {"value": np.tril(np.ones((max_positions, max_positions), dtype=bool))[None, None]}
    for i in range(layers):
        x = _gpt2_block(g, x, i, hidden, heads, head_dim, std, causal)
    x = _layer_norm(g, x, hidden, "/transformer/ln_f", "transformer.ln_f", 1e-5)
    # lm_head.weight is wte.weight: the exporter folds its transpose into a second initializer
    g.op("MatMul", [x, g.initializer(f"onnx::MatMul_{next(g._weight_ids)}", wte.T)], "/lm_head", name="logits")

    past_shape = ["batch", heads, "past_sequence", head_dim]
    present_shape = ["batch", heads, "present_sequence", head_dim]
    kv = [(i, kind) for i in range(layers) for kind in ("key", "value")]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])]
    inputs += [helper.make_tensor_value_info(f"past_key_values.{i}.{k}", TensorProto.FLOAT, past_shape) for i, k in kv]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", vocab])]
    outputs += [helper.make_tensor_value_info(f"present.{i}.{k}", TensorProto.FLOAT, present_shape) for i, k in kv]
    return g.model("gpt2", inputs, outputs, doc=f"GPT-2 decoder with KV cache: {layers} layers, hidden {hidden}, "
                                                f"{heads} heads, vocab {vocab} (random weights)")


def _gpt2_block(g, x, i, hidden, heads, head_dim, std, causal):
    s, p = f"/transformer/h.{i}", f"transformer.h.{i}"
    att = f"{s}/attn"
    h = _layer_norm(g, x, hidden, f"{s}/ln_1", f"{p}.ln_1", 1e-5)
    qkv = _linear(g, h, hidden, 3 * hidden, f"{att}/c_attn", f"{p}.attn.c_attn", std)
    q, k, v = g.op("Split", [qkv, g.const([hidden] * 3, att, np.int64)], att, outputs=3, axis=2)
    q, k, v = (_split_heads(g, t, heads, head_dim, att) for t in (q, k, v))
    k = g.op("Concat", [f"past_key_values.{i}.key", k], att, name=f"present.{i}.key", axis=-2)
    v = g.op("Concat", [f"past_key_values.{i}.value", v], att, name=f"present.{i}.value", axis=-2)
    scores = g.op("MatMul", [q, g.op("Transpose", [k], att, perm=[0, 1, 3, 2])], att)
    # / torch.full([], v.size(-1) ** 0.5): the size read at run time, cast, Pow, added to an empty-shape zero
    d = g.op("Cast", [_size_from_end(g, v, -1, att)], att, to=TensorProto.FLOAT)
    d = g.op("Pow", [d, g.const(0.5, att, np.float32)], att)
    zero = g.op("ConstantOfShape", [g.const(np.zeros(0, np.int64), att)], att,
                value=numpy_helper.from_array(np.zeros(1, np.float32)))
    scores = g.op("Div", [scores, g.op("Add", [zero, d], att)], att)
    # causal = bias[:, :, kl - ql : kl, :kl]; where(causal, scores, finfo.min)
    ql, kl = _size_from_end(g, q, -2, att), _size_from_end(g, k, -2, att)
    start = g.op("Sub", [kl, ql], att)
    if "name" not in causal:
        causal["name"] = g.const(causal["value"], att)
    bias = causal["name"]
    axis2 = g.const([2], att, np.int64)
    rows = g.op("Slice", [bias, g.op("Unsqueeze", [start, g.const([0], att, np.int64)], att),
                          g.op("Unsqueeze", [kl, g.const([0], att, np.int64)], att), axis2,
                          g.const([1], att, np.int64)], att)
    axis3, zero_start = g.const([3], att, np.int64), g.const([0], att, np.int64)
    cols = g.op("Slice", [rows, zero_start, g.op("Unsqueeze", [kl, g.const([0], att, np.int64)], att), axis3,
                          g.const([1], att, np.int64)], att)
    scores = g.op("Where", [cols, scores, g.const(np.finfo(np.float32).min, att, np.float32)], att)
    probs = g.op("Softmax", [scores], att, axis=-1)
    ctx = _merge_heads(g, g.op("MatMul", [probs, v], att), hidden, att)
    x = g.op("Add", [x, _linear(g, ctx, hidden, hidden, f"{att}/c_proj", f"{p}.attn.c_proj", std)], s)
    h = _layer_norm(g, x, hidden, f"{s}/ln_2", f"{p}.ln_2", 1e-5)
    h = _gelu_tanh(g, _linear(g, h, hidden, 4 * hidden, f"{s}/mlp/c_fc", f"{p}.mlp.c_fc", std), f"{s}/mlp/act")
    return g.op("Add", [x, _linear(g, h, 4 * hidden, hidden, f"{s}/mlp/c_proj", f"{p}.mlp.c_proj", std)], s)


def _gelu_tanh(g, x, scope):
    """GPT-2's gelu_new: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))."""
    half = g.op("Mul", [x, g.const(0.5, scope, np.float32)], scope)
    cube = g.op("Pow", [x, g.const(3.0, scope, np.float32)], scope)
    inner = g.op("Add", [x, g.op("Mul", [cube, g.const(0.044715, scope, np.float32)], scope)], scope)
    t = g.op("Tanh", [g.op("Mul", [inner, g.const(math.sqrt(2 / math.pi), scope, np.float32)], scope)], scope)
    return g.op("Mul", [half, g.op("Add", [t, g.const(1.0, scope, np.float32)], scope)], scope)


def gpt2_feeds(batch: int, past: int, layers=12, heads=12, head_dim=64, vocab=GPT2_VOCAB, sequence=1, seed=0) -> dict:
    """One step's inputs: random token ids and a random cache of `past` positions."""
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(0, vocab, (batch, sequence), dtype=np.int64)}
    for i in range(layers):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = rng.standard_normal((batch, heads, past, head_dim), dtype=np.float32)
    return feeds


# ---------------------------------------------------------------- MobileNetV2

# (expansion t, output channels c, repeats n, first stride s), as in the MobileNetV2 paper
_MOBILENET_V2_BLOCKS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                        (6, 320, 1, 1)]


def _divisible(v, divisor=8):
    """torchvision's _make_divisible: round channels to a multiple of 8, never down by over 10%."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


def mobilenet(width=1.0, resolution=224, classes=1000, seed=0) -> onnx.ModelProto:
    """MobileNetV2 (3.5 M parameters at width 1.0) as torch.onnx.export writes torchvision's
    mobilenet_v2 in eval mode: BatchNormalization folded into each Conv's bias, ReLU6 as
    Clip(x, Constant 0, Constant 6), GlobalAveragePool, Flatten, Gemm.
    Input [batch, 3, resolution, resolution]."""
    g = _Graph(seed)
    layer = iter(range(1 << 20))

    def conv(x, c_in, c_out, kernel, stride=1, groups=1, act=True):
        idx = next(layer)
        fan_in = c_in // groups * kernel * kernel
        # He-normal weights through ReLU6, unit gain into the linear bottleneck
        w = g.weight(f"onnx::Conv_{idx}_w", (c_out, c_in // groups, kernel, kernel),
                     math.sqrt((2.0 if act else 1.0) / fan_in))
        b = g.weight(f"onnx::Conv_{idx}_b", (c_out,), 0.01)
        pad = kernel // 2
        y = g.op("Conv", [x, w, b], f"/features.{idx}", kernel_shape=[kernel, kernel], strides=[stride, stride],
                 pads=[pad] * 4, group=groups, dilations=[1, 1])
        if not act:
            return y
        # ReLU6: Clip with its bounds in two scalar Constant nodes, per Clip, as exported
        scope = f"/features.{idx}"
        return g.op("Clip", [y, g.const(0.0, scope, np.float32), g.const(6.0, scope, np.float32)], scope)

    c_in = _divisible(32 * width)
    x = conv("input", 3, c_in, 3, stride=2)
    for t, c, n, s in _MOBILENET_V2_BLOCKS:
        c_out = _divisible(c * width)
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = c_in * t
            y = conv(x, c_in, hidden, 1) if t != 1 else x  # 1x1 expand
            y = conv(y, hidden, hidden, 3, stride=stride, groups=hidden)  # 3x3 depthwise
            y = conv(y, hidden, c_out, 1, act=False)  # 1x1 linear project
            x = g.op("Add", [x, y], "/features") if stride == 1 and c_in == c_out else y
            c_in = c_out
    last = _divisible(1280 * max(1.0, width))
    x = conv(x, c_in, last, 1)
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    g.op("Gemm", [x, g.weight("classifier.1.weight", (classes, last), 0.01),
                  g.weight("classifier.1.bias", (classes,), 0.01)], "/classifier", name="output", transB=1)
    inp = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, resolution, resolution])
    out = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", classes])
    return g.model("mobilenet_v2", [inp], [out], doc=f"MobileNetV2 width {width}, {resolution}x{resolution} "
                                                      "(random weights, BatchNormalization folded)")


# ---------------------------------------------------------------- a YOLOv8-style backbone


def yolo(width=(16, 32, 64, 128, 256), resolution=320, seed=0) -> onnx.ModelProto:
    """The backbone and SPPF of YOLOv8n as torch.onnx.export writes ultralytics' model in eval
    mode: every Conv's BatchNormalization folded into its bias, SiLU as Sigmoid then Mul (ONNX
    has no SiLU op), C2f blocks (a 1x1 conv, Split in two, bottlenecks of two 3x3 convs with a
    residual Add, Concat, a 1x1 conv), SPPF (three chained 5x5 MaxPools, Concat). Input
    [batch, 3, resolution, resolution]; the three feature maps the neck reads are the outputs."""
    g = _Graph(seed)
    layer = iter(range(1 << 20))

    def conv(x, c_in, c_out, kernel=1, stride=1):
        idx = next(layer)
        scope = f"/model.{idx}/conv"
        fan_in = c_in * kernel * kernel
        w = g.weight(f"model.{idx}.conv.weight", (c_out, c_in, kernel, kernel), math.sqrt(2.0 / fan_in))
        b = g.weight(f"model.{idx}.conv.bias", (c_out,), 0.05)
        y = g.op("Conv", [x, w, b], scope, kernel_shape=[kernel, kernel], strides=[stride, stride],
                 pads=[kernel // 2] * 4, dilations=[1, 1], group=1)
        return g.op("Mul", [y, g.op("Sigmoid", [y], f"/model.{idx}/act")], f"/model.{idx}/act")

    def c2f(x, c_in, c_out, n, shortcut=True):
        h = c_out // 2
        y = conv(x, c_in, 2 * h)
        parts = g.op("Split", [y, g.const([h, h], "/c2f", np.int64)], "/c2f", outputs=2, axis=1)
        for _ in range(n):
            z = conv(conv(parts[-1], h, h, 3), h, h, 3)
            parts.append(g.op("Add", [parts[-1], z], "/c2f/m") if shortcut else z)
        return conv(g.op("Concat", parts, "/c2f", axis=1), (2 + n) * h, c_out)

    def sppf(x, c_in, c_out):
        h = c_in // 2
        y = [conv(x, c_in, h)]
        for _ in range(3):
            y.append(g.op("MaxPool", [y[-1]], "/sppf/m", kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2]))
        return conv(g.op("Concat", y, "/sppf", axis=1), 4 * h, c_out)

    c0, c1, c2, c3, c4 = width
    x = conv(conv("images", 3, c0, 3, 2), c0, c1, 3, 2)
    x = c2f(x, c1, c1, 1)
    p3 = c2f(conv(x, c1, c2, 3, 2), c2, c2, 2)
    p4 = c2f(conv(p3, c2, c3, 3, 2), c3, c3, 2)
    p5 = sppf(c2f(conv(p4, c3, c4, 3, 2), c4, c4, 1), c4, c4)
    for name, v in (("p3", p3), ("p4", p4), ("p5", p5)):
        g.op("Identity", [v], "/out", name=name)
    inp = helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, resolution, resolution])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", c, resolution // s, resolution // s])
            for n, c, s in (("p3", c2, 8), ("p4", c3, 16), ("p5", c4, 32))]
    return g.model("yolov8n_backbone", [inp], outs, doc=f"YOLOv8n-style backbone + SPPF, {resolution}x{resolution} "
                                                        "(random weights, BatchNormalization folded, SiLU as Sigmoid·x)")


# ---------------------------------------------------------------- the onnx package's light models


def light(name: str, batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """A light model from the onnx package with random weights and batch `batch`: the input's
    and outputs' first dim and each Reshape target that spells the batch out as 1 are rewritten."""
    if name not in light_models.NAMES:
        raise ValueError(f"no light model '{name}' (one of {', '.join(light_models.NAMES)})")
    model = light_models.randomize_weights(onnx.load(light_models.path(name)), seed=seed)
    # These are IR 3 models, where every initializer is also listed as a graph input (the
    # random weights are not, which onnx.checker refuses). Moved to IR 4 with the weights
    # out of the inputs: the same constants to every runtime (an IR 4 initializer that is
    # also an input could be overridden, and onnxruntime would then not fold it).
    model.ir_version = max(model.ir_version, 4)
    graph_inputs = [vi for vi in model.graph.input if vi.name not in {t.name for t in model.graph.initializer}]
    del model.graph.input[:]
    model.graph.input.extend(graph_inputs)
    used = {i for n in model.graph.node for i in n.input}
    weights = [t for t in model.graph.initializer if t.name in used]  # not the dropped ConstantOfShapes' shapes
    del model.graph.initializer[:]
    model.graph.initializer.extend(weights)
    inits = {t.name: t for t in model.graph.initializer}
    if batch == 1:
        return model
    for vi in [*model.graph.input, *model.graph.output]:
        if vi.name not in inits:
            vi.type.tensor_type.shape.dim[0].dim_value = batch
    del model.graph.value_info[:]
    for node in model.graph.node:
        if node.op_type != "Reshape" or node.input[0] in inits or node.input[1] not in inits:
            continue
        target = numpy_helper.to_array(inits[node.input[1]]).copy()
        if target.size and target[0] == 1:  # e.g. [1, 2048] before the classifier, [1, 4, 28, 56, 56] in shufflenet
            target[0] = batch
            inits[node.input[1]].CopyFrom(numpy_helper.from_array(target, node.input[1]))
    return model


# ---------------------------------------------------------------- the names the command line accepts


@dataclass(frozen=True)
class SuiteModel:
    """A built-in model: `build(dims)` returns it, `dims` are the default bindings of its
    symbolic dims (overridden by --dim), and `feeds(dims, seed)` makes realistic inputs
    (None: generated from the declared input shapes)."""

    name: str
    description: str
    build: Callable[[dict], onnx.ModelProto]
    dims: dict
    feeds: Callable[[dict, int], dict] | None = None


def _suite() -> dict[str, SuiteModel]:
    suite = {
        "mobilenet": SuiteModel("mobilenet", "MobileNetV2, 224x224, 3.5 M parameters", lambda d: mobilenet(),
                                {"batch": 1}),
        "yolo": SuiteModel("yolo", "YOLOv8n-style backbone + SPPF, SiLU as Sigmoid·x, 320x320",
                           lambda d: yolo(), {"batch": 1}),
        "bert-base": SuiteModel(
            "bert-base", "BERT-base encoder, 12 layers, hidden 768, vocab 30522",
            lambda d: bert(), {"batch": 1, "sequence": 128},
            lambda d, seed: bert_feeds(d["batch"], d["sequence"], BERT_VOCAB, seed)),
        "gpt2-step": SuiteModel(
            "gpt2-step", "GPT-2 decoder step with a KV cache, 12 layers, hidden 768, vocab 50257",
            lambda d: gpt2(), {"batch": 1, "sequence": 1, "past_sequence": 16},
            lambda d, seed: gpt2_feeds(d["batch"], d["past_sequence"], sequence=d["sequence"], seed=seed)),
    }
    for name in light_models.NAMES:
        suite[f"light:{name}"] = SuiteModel(f"light:{name}", f"light_{name} from the onnx package, random weights",
                                            lambda d, name=name: light(name, d["batch"]), {"batch": 1})
    return suite


SUITE = _suite()
ALIASES = {"bert": "bert-base", "gpt2": "gpt2-step", "mobilenet-v2": "mobilenet", "mobilenetv2": "mobilenet"}


def lookup(name: str) -> SuiteModel | None:
    """The built-in model called `name` (or an alias, or a light model's bare name), or None."""
    name = ALIASES.get(name, name)
    if name in SUITE:
        return SUITE[name]
    return SUITE.get(f"light:{name}") if not name.endswith(".onnx") else None
