"""Graph passes: Graph → Graph', in one ordered pipeline (see manager.py for the rules).

To add a pass: write `fn(graph, ctx) -> (graph', [changes])` in a module of its own here,
then add a `Pass` entry below at the point of the order where it belongs, with its level
and what it needs. `glassrt explain MODEL` lists every pass that ran and what it changed.
"""
from __future__ import annotations

from .bodies import has_bodies, optimize_bodies
from .cache_concat import mark_cache_concats
from .constant_folding import fold_constants
from .conv_folding import fold_affine_into_conv, fold_batchnorm_into_conv
from .center_qlinear_convs import center_qlinear_convs
from .cse import eliminate_common_subexpressions
from .dead_code import remove_dead_code
from .expand import expand_composites
from .fold_transposes import fold_transposes
from .fuse_attention import fuse_attention
from .fuse_conv import fuse_conv_activation, fuse_conv_residual
from .fuse_conv_qdq import fuse_conv_qdq
from .fuse_gelu import fuse_gelu
from .fuse_hardswish import fuse_hardswish
from .fuse_layernorm import fuse_layernorm
from .fuse_lookup import fuse_lookup
from .fuse_matmul import fuse_matmul
from .fuse_matmul_integer import fuse_matmul_integer
from .fuse_qdq import fuse_qdq
from .fuse_qdq_conv import fuse_qdq_conv
from .fuse_qdq_matmul import fuse_qdq_matmul
from .fuse_shuffle import fuse_channel_shuffle
from .identity import remove_identities
from .manager import LEVELS, Pass, PassContext, PassRecord, level_rank, run_pipeline, selected  # noqa: F401
from .tied_weights import tie_transposed_weights

TYPES, PROVIDERS = "types", "providers"

PIPELINE = [
    Pass("remove_dead_code", "basic", remove_dead_code, doc="nodes and initializers nothing reads"),
    Pass("remove_identities", "basic", remove_identities,
         doc="Identity and inference Dropout: their readers read the input"),
    Pass("tie_transposed_weights", "basic", tie_transposed_weights, persists=False,
         doc="a weight that is another's transpose (a tied embedding's copy) becomes a view of it"),
    Pass("expand_composites", "required", expand_composites, frozenset({TYPES, PROVIDERS}),
         doc="composite ops no provider runs whole become their decompositions"),
    # before fold_constants, which would turn the weights' DequantizeLinear into float weights
    Pass("fuse_qdq_conv", "extended", fuse_qdq_conv, frozenset({TYPES, PROVIDERS}), option="fusion",
         doc="Conv / Add between DequantizeLinear and QuantizeLinear (a QDQ CNN's layers) become QLinearConv / "
             "QLinearAdd (where an exact 8-bit engine runs them)"),
    Pass("fuse_lookup", "extended", fuse_lookup, frozenset({TYPES}), option="fusion",
         doc="QLinearMul of x and QLinearSigmoid of x (a quantized SiLU) becomes one glassrt::LookupTable of "
             "x's 256 codes"),
    Pass("fuse_qdq_matmul", "extended", fuse_qdq_matmul, frozenset({TYPES, PROVIDERS}), option="fusion",
         doc="MatMul of two DequantizeLinear outputs, one of constant 8-bit weights, becomes MatMulInteger, "
             "Cast and Mul (the integer product, where an exact 8-bit engine runs it)"),
    Pass("fold_constants", "basic", fold_constants, frozenset({TYPES, PROVIDERS}), option="constant_folding",
         doc="nodes whose inputs are all constants are evaluated once"),
    # after fold_constants: the weights' scales and biases may come from Constant nodes
    Pass("fuse_matmul_integer", "extended", fuse_matmul_integer, frozenset({TYPES, PROVIDERS}), option="fusion",
         doc="MatMulInteger + Cast + Mul by the two scales' product [+ bias Add] (quantize_dynamic's layers) "
             "become one com.microsoft::MatMulIntegerToFloat (where an exact 8-bit engine runs it)"),
    Pass("fold_affine_into_conv", "basic", fold_affine_into_conv, option="fusion",
         doc="per-channel Mul/Add after Conv or BatchNormalization go into its parameters"),
    Pass("fold_batchnorm_into_conv", "basic", fold_batchnorm_into_conv, option="fusion",
         doc="inference BatchNormalization after Conv goes into its weights and bias"),
    Pass("fuse_hardswish", "extended", fuse_hardswish, option="fusion",
         doc="HardSwish written out (x·Clip(x + 3, 0, 6)/6) becomes one HardSwish"),
    Pass("fuse_conv_residual", "extended", fuse_conv_residual, frozenset({TYPES}), option="fusion",
         doc="Conv + same-shape residual Add [+ Relu] become one glassrt::FusedConv"),
    Pass("fuse_conv_activation", "extended", fuse_conv_activation, option="fusion",
         doc="Conv/BatchNormalization + Relu/LeakyRelu/Clip/Sigmoid become one fused op"),
    Pass("fuse_gelu", "extended", fuse_gelu, option="fusion", doc="GELU written out with Erf becomes one Gelu"),
    Pass("fuse_layernorm", "extended", fuse_layernorm, frozenset({TYPES}), option="fusion",
         doc="layer normalization written out (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div [, Mul, Add]) "
             "becomes one LayerNormalization"),
    Pass("fuse_qdq", "extended", fuse_qdq, frozenset({TYPES}), option="fusion",
         doc="QuantizeLinear + DequantizeLinear on a float activation (per tensor, same parameters) become "
             "one glassrt::QuantizeDequantize"),
    Pass("fuse_conv_qdq", "extended", fuse_conv_qdq, option="fusion",
         doc="Conv [+ residual + activation] whose output only a glassrt::QuantizeDequantize reads becomes one "
             "glassrt::FusedConv quantizing in its epilogue"),
    Pass("fuse_channel_shuffle", "extended", fuse_channel_shuffle, frozenset({TYPES}), option="fusion",
         doc="Reshape + Transpose + Reshape of a channel shuffle become one glassrt::ChannelShuffle"),
    Pass("fuse_attention", "extended", fuse_attention, frozenset({TYPES}), option="fusion",
         doc="attention over a KV cache (Q·Kᵀ, scale, mask, Softmax, ·V) becomes one "
             "glassrt::ScaledDotProductAttention"),
    # after fuse_attention: a fused attention's mask does not shape its output (see cse.py)
    Pass("eliminate_common_subexpressions", "basic", eliminate_common_subexpressions, frozenset({TYPES}),
         doc="a node computing what an earlier one does (same op and inputs, or inputs proved equal) is dropped"),
    Pass("fuse_matmul", "extended", fuse_matmul, frozenset({TYPES}), option="fusion",
         doc="MatMul + scale + bias Add + residual/mask Add + activation become one glassrt::FusedMatMul"),
    Pass("fold_transposes", "extended", fold_transposes, frozenset({TYPES}), option="fusion",
         doc="Transposes into and out of a product of two computed values (attention's heads) are read "
             "and written through permuted strides by a glassrt::FusedMatMul"),
    Pass("center_qlinear_convs", "extended", center_qlinear_convs, option="fusion",
         doc="two QLinearConv in a row, where oneDNN runs them as float32 convs, hand each other float32 codes "
             "(glassrt::CenteredQLinearConv) instead of 8-bit bytes converted out and back in"),
    Pass("mark_cache_concats", "extended", mark_cache_concats, option="fusion",
         doc="a KV cache's Concat (graph input + new rows -> graph output) becomes glassrt::CacheConcat, which "
             "appends into spare room behind a past it handed out instead of copying the whole cache"),
]


def run_passes(graph, options, providers, infer_types):
    """(graph', PassContext with what the passes found, [PassRecord])."""
    ctx = PassContext(options, providers)
    chosen = selected(PIPELINE, options)
    done = already_applied(graph)
    skipped = [p for p in chosen if done and p.persists and p.level != "required"
               and level_rank(p.level) <= level_rank(done)]
    passes = [p for p in chosen if p not in skipped]
    graph, records = run_pipeline(graph, passes, ctx, infer_types)
    body_records = []
    if has_bodies(graph):
        # the top graph's types are the scope of its bodies (and stay its final types: the
        # bodies' passes keep every output's type)
        ctx.final_inference = ctx.final_inference or infer_types(graph, reuse=ctx.first_inference)
        graph = optimize_bodies(graph, passes, ctx, ctx.final_inference, graph.constants(), body_records)
    n, ran = len(graph.nodes), iter(records)
    why = f"already applied (glassrt optimize, level {done})"
    return graph, ctx, [PassRecord(p.name, p.level, [], n, n, 0.0, skipped=why) if p in skipped else next(ran)
                        for p in chosen] + body_records


def already_applied(graph) -> str | None:
    """The optimization level a model file says this glassrt version already applied to it
    (`glassrt optimize` writes glassrt.version and glassrt.level into its metadata), or
    None. Its optional passes would find nothing more to rewrite, so they are not run
    again; the required ones always run. A file written by another glassrt version is
    optimized again: passes change between versions."""
    from .. import __version__

    props = (graph.meta or {}).get("custom_metadata_map") or {}
    level = props.get("glassrt.level")
    if props.get("glassrt.version") != __version__ or level not in LEVELS:
        return None
    return level
