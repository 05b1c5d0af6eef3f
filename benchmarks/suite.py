"""glassrt against onnxruntime on the benchmark suite, each runtime in its own process.

The suite (glassrt/tools/bench_models.py, random weights, nothing downloaded): the nine
light models of the onnx package at batch 1 and 8, MobileNetV2 at batch 1, a YOLOv8n-style
backbone (320x320, SiLU written as Sigmoid and Mul, C2f blocks' channel Splits), a BERT-base
encoder at batch 1 and 8 (sequence 128), and greedy decoding on a GPT-2-sized model with
a KV cache (a 16-token prompt, then 32 tokens; both runtimes must produce the same ones;
with --warmup, one untimed generation per runtime first, its steps shown apart as the
first round: a process's first generation makes its plans). And the int8 models users
publish, made from those by onnxruntime.quantization: BERT-base through quantize_dynamic
(int8 weights), MobileNetV2 through quantize_static in both its formats (QDQ and
QOperator; calibrated on four random inputs).
Measured with `glassrt bench`'s machinery (glassrt.tools.bench): one worker process per
model and runtime, timed runs in alternating turns, the same inputs and thread count.

Prints a markdown table to stdout (progress goes to stderr); --json writes everything.
Run from the repository root: python benchmarks/suite.py --runs 10 --threads 2
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from math import nan
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnx  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,  # noqa: E402
                           TimeElapsedColumn)

from glassrt.tools import bench  # noqa: E402
from glassrt.tools import bench_models as bm  # noqa: E402
from glassrt.tools import light_models  # noqa: E402

# a short prompt, and a long one where the KV caches' copies (a Concat per cache per token)
# would grow with the context: 12 x 512 x 64 floats a cache, 24 caches
PROMPTS, NEW_TOKENS = (16, 512), 32
# 8-bit models agree to within their quantization, not float rounding: onnxruntime's own
# sessions of these, optimized and not, differ by 0.09 (BERT-base int8, outputs up to ~6)
# and by one step of the output's quantization (MobileNetV2 int8: 0.026 of outputs up to ~1.7)
INT8_TOLERANCE = {"bert": (0.0, 0.25), "mobilenet": (0.0, 0.1)}


@dataclass
class Entry:
    """One line of the suite: `make()` builds its model (once, however many entries share
    it) and returns the Case to measure."""

    label: str
    make: Callable[[], bench.Case]
    decode: bool = False


class ModelFiles:
    """Each suite model built and saved once, on first use, in a temporary folder: BERT's
    batch 1 and 8 share a file."""

    def __init__(self, workdir: str):
        if not Path(workdir).is_dir():
            raise ValueError(f"no folder {workdir!r} for the suite's models")
        self.workdir, self.paths = workdir, {}

    def path(self, key: str, build: Callable[[], onnx.ModelProto]) -> str:
        if key not in self.paths:
            path = str(Path(self.workdir) / f"{key.replace(':', '_')}.onnx")
            onnx.save(build(), path)
            self.paths[key] = path
        return self.paths[key]

    def derived(self, key: str, source: str, convert: Callable[[str, str], None]) -> str:
        """A model made from the file `source` by `convert(source, target)` (a quantizer), once."""
        if key not in self.paths:
            path = str(Path(self.workdir) / f"{key}.onnx")
            convert(source, path)
            self.paths[key] = path
        return self.paths[key]


def quantize_dynamic(source: str, target: str) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic as quantize

    quantize(source, target, weight_type=QuantType.QInt8)


def quantize_static(fmt: str, feeds: dict) -> Callable[[str, str], None]:
    """onnxruntime's quantize_static in format "QDQ" or "QOperator" (uint8 activations, int8
    weights per channel), calibrated on four random inputs shaped as `feeds`."""
    def convert(source: str, target: str) -> None:
        import numpy as np
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static as quantize

        class Reader(CalibrationDataReader):
            def __init__(self):
                rng = np.random.default_rng(0)
                self.batches = iter([{k: rng.random(v.shape, dtype=np.float32) for k, v in feeds.items()}
                                     for _ in range(4)])

            def get_next(self):
                return next(self.batches, None)

        quantize(source, target, Reader(), quant_format=getattr(QuantFormat, fmt), per_channel=True,
                 activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return convert


def entries(files: ModelFiles) -> list[Entry]:
    out = []
    for batch in (1, 8):
        for name in light_models.NAMES:
            def make(name=name, batch=batch):
                model = bm.light(name, batch)
                path = files.path(f"light_{name}_b{batch}", lambda: model)
                feeds = bench.generate_feeds(model, {})
                return bench.Case(f"light:{name} batch={batch}", path, feeds, {"batch": batch})
            out.append(Entry(f"light:{name} batch={batch}", make))

    for name, build in (("mobilenet", bm.mobilenet), ("yolo", bm.yolo)):
        def cnn(name=name, build=build):
            model = build()
            dims = {"batch": 1}
            return bench.Case(f"{name} batch=1", files.path(name, lambda: model), bench.generate_feeds(model, dims), dims)
        out.append(Entry(f"{name} batch=1", cnn))
    for batch in (1, 8):
        def bert(batch=batch):
            dims = {"batch": batch, "sequence": 128}
            return bench.Case(f"bert-base batch={batch} sequence=128", files.path("bert-base", bm.bert),
                              bm.bert_feeds(batch, 128), dims)
        out.append(Entry(f"bert-base batch={batch} sequence=128", bert))

    def bert_int8():
        dims = {"batch": 1, "sequence": 128}
        path = files.derived("bert-base-int8", files.path("bert-base", bm.bert), quantize_dynamic)
        return bench.Case("bert-base int8 (quantize_dynamic) batch=1 sequence=128", path, bm.bert_feeds(1, 128), dims,
                          tolerance=INT8_TOLERANCE["bert"])
    out.append(Entry("bert-base int8 (quantize_dynamic) batch=1 sequence=128", bert_int8))
    for fmt in ("QDQ", "QOperator"):
        def mobilenet_int8(fmt=fmt):
            model, dims = bm.mobilenet(), {"batch": 1}
            feeds = bench.generate_feeds(model, dims)
            path = files.derived(f"mobilenet-int8-{fmt}", files.path("mobilenet", lambda: model),
                                 quantize_static(fmt, feeds))
            return bench.Case(f"mobilenet int8 ({fmt}) batch=1", path, feeds, dims, tolerance=INT8_TOLERANCE["mobilenet"])
        out.append(Entry(f"mobilenet int8 ({fmt}) batch=1", mobilenet_int8))

    for prompt in PROMPTS:
        def gpt2(prompt=prompt):
            # the prompt, with every past empty: the first call of a generation
            feeds = bm.gpt2_feeds(1, 0, sequence=prompt)
            return bench.Case(f"gpt2 decode {NEW_TOKENS} tokens after {prompt}", files.path("gpt2", bm.gpt2), feeds,
                              {"batch": 1})
        out.append(Entry(f"gpt2 decode {NEW_TOKENS} tokens after {prompt}", gpt2, decode=True))
    return out


def cache_map(feeds: dict) -> dict:
    """present.{i}.key -> past_key_values.{i}.key, for every past input."""
    prefix = "past_key_values."
    return {"present." + k[len(prefix):]: k for k in feeds if k.startswith(prefix)}


def run_suite(selected: list[Entry], settings: bench.Settings, rounds: int, console) -> tuple[list, list]:
    results, decoding = [], []
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        overall = bar.add_task("suite", total=len(selected))
        for entry in selected:
            total = rounds if entry.decode else settings.runs
            task = bar.add_task(entry.label, total=total * len(settings.runtimes))
            status = lambda text, task=task: bar.update(task, description=text)  # noqa: E731
            progress = lambda n, task=task: bar.advance(task, n)  # noqa: E731
            status(f"{entry.label}: building")
            case = entry.make()
            if entry.decode:
                decoding.append(bench.bench_generation(case, settings, NEW_TOKENS, cache_map(case.feeds), rounds,
                                                       status, progress))
            else:
                results.append(bench.bench_case(case, settings, status, progress))
            bar.remove_task(task)
            console.print(_one_line((decoding if entry.decode else results)[-1]), markup=False, highlight=False)
            bar.advance(overall)
    return results, decoding


def _one_line(r: dict) -> str:
    """An entry's result as soon as it is in (on stderr): a long run killed halfway keeps these."""
    if r["error"]:
        return f"{r['model']}: error: {r['error']}"
    medians = ", ".join(f"{rt} {x['median_ms']:.2f} ms" for rt, x in r["runtimes"].items())
    return f"{r['model']}: {medians}" + (f", ratio {r['ratio']:.2f}x" if r.get("ratio") else "")


# ---------------------------------------------------------------- markdown


def _pair(r: dict, key: str, fmt: str, scale: float = 1.0) -> str:
    vals = [r["runtimes"][rt].get(key) for rt in r["runtimes"]]
    return " / ".join("-" if v is None else format(v * scale, fmt) for v in vals)


def _creation(r: dict) -> str:
    """Creation + first run, glassrt / onnxruntime (medians over the starts), and their ratio."""
    x = {rt: v.get("create_and_first_run_s") for rt, v in r["runtimes"].items()}
    g, o = x.get("glassrt"), x.get("onnxruntime")
    return _pair(r, "create_and_first_run_s", ".2f") + (f" ({g / o:.1f}x)" if g and o else "")


def _agree(r: dict) -> str:
    a = r["agreement"]
    if a is None:
        return "-"
    worst = max((o["max_abs"] or 0.0) for o in a["outputs"])
    within = "" if (a["rtol"], a["atol"]) == (bench.RTOL, bench.ATOL) else f", atol {a['atol']:g}"
    return f"yes ({worst:.0e}{within})" if a["agree"] else f"**outputs differ** ({worst:.1e}{within})"


def latency_table(results: list) -> list[str]:
    lines = ["| model | glassrt ms | onnxruntime ms | glassrt / ort | p90 ms (g / o) | create + 1st run s (g / o) "
             "| peak RSS MiB (g / o) | outputs agree (max abs diff) |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        if r["error"]:
            lines.append(f"| {r['model']} | error: {r['error']} | | | | | | |")
            continue
        med = {rt: x["median_ms"] for rt, x in r["runtimes"].items()}
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "-"
        lines.append(f"| {r['model']} | {med.get('glassrt', nan):.2f} | {med.get('onnxruntime', nan):.2f} | {ratio} "
                     f"| {_pair(r, 'p90_ms', '.1f')} | {_creation(r)} "
                     f"| {_pair(r, 'peak_rss_bytes', ',.0f', 1 / 2**20)} | {_agree(r)} |")
    return lines


def decode_table(decoding: list) -> list[str]:
    lines = ["| model | glassrt ms/token | onnxruntime ms/token | glassrt / ort | tokens/s (g / o) | prompt ms (g / o) "
             "| first round ms/token (g / o) | create + 1st run s (g / o) | peak RSS MiB (g / o) | same tokens |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in decoding:
        if r["error"]:
            lines.append(f"| {r['model']} | error: {r['error']} | | | | | | | | |")
            continue
        med = {rt: x["median_ms"] for rt, x in r["runtimes"].items()}
        ratio = f"{r['ratio']:.2f}x" if r.get("ratio") else "-"
        same = "yes" if r["same_tokens"] else "**no**"
        if not all(x["deterministic"] for x in r["runtimes"].values()):
            same += " (a runtime changed its tokens between rounds)"
        lines.append(f"| {r['model']} | {med.get('glassrt', nan):.1f} | {med.get('onnxruntime', nan):.1f} | {ratio} "
                     f"| {_pair(r, 'tokens_per_s', '.1f')} | {_pair(r, 'prefill_ms', '.0f')} "
                     f"| {_pair(r, 'cold_median_ms', '.1f')} | {_creation(r)} "
                     f"| {_pair(r, 'peak_rss_bytes', ',.0f', 1 / 2**20)} | {same} |")
    return lines


def geomeans(results: list) -> list[str]:
    light = [r for r in results if r["model"].startswith("light:")]
    groups = {"all models above": results,
              **{f"light models, batch {b}": [r for r in light if r["dims"].get("batch") == b] for b in (1, 8)}}
    out = []
    for name, rs in groups.items():
        ratios = [r["ratio"] for r in rs if r["ratio"]]
        if len(ratios) > 1:
            out.append(f"- geometric mean glassrt / onnxruntime, {name} ({len(ratios)}): "
                       f"**{bench.geometric_mean(ratios):.2f}x**")
    return out


def _saturation_note(full: dict, env: dict) -> list[str]:
    """Where an 8-bit row disagrees on a CPU without VNNI or AMX, what is known about why."""
    differ = [r for r in full["models"] if "int8" in r["model"] and r["agreement"] and not r["agreement"]["agree"]]
    if not differ or "no VNNI" not in (env.get("vector_isa") or ""):
        return []
    return ["- this CPU has no VNNI or AMX: onnxruntime's u8 x s8 products pass pairs through a saturating 16-bit add "
            "here (MLAS's vpmaddubsw; measured on the QOperator MobileNetV2's first conv: up to 41 codes off the "
            "int64 sums, glassrt's within one at a rounding tie), while glassrt's 8-bit products stay exact "
            "(kernels/onednn/int8_float.py); that error is part of the difference in the int8 rows above"]


def markdown(full: dict, settings: bench.Settings) -> str:
    env = full["environment"]
    blas = sorted({x["blas"] for r in full["models"] + full["generation"] for x in r["runtimes"].values()})
    pk = env["packages"]
    lines = [f"{bench.title(settings)}.", "",
             f"{bench.machine_line(env)}; glassrt {pk['glassrt']}, onnxruntime {pk['onnxruntime']}, "
             f"numpy {pk['numpy']}, onnx {pk['onnx']}; matrix products: {', '.join(blas)}.", ""]
    if full["models"]:
        lines += latency_table(full["models"]) + [""] + geomeans(full["models"]) + _saturation_note(full, env) + [""]
    if full["generation"]:
        lines += decode_table(full["generation"]) + [""]
    return "\n".join(lines)


def _compile_bytecode():
    """glassrt's .pyc files, as pip writes them when it installs a wheel: session creation is
    measured after the one-time compile of a fresh install, and an editable install under
    PYTHONDONTWRITEBYTECODE=1 (these machines set it) would otherwise compile every module
    glassrt imports lazily (its kernels) inside the timed creation, in every worker."""
    import compileall

    import glassrt

    compileall.compile_dir(str(Path(glassrt.__file__).parent), quiet=1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10, help="timed runs per model and runtime")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--busy", type=int, default=0, help="CPU-bound processes running during the timed runs")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="generations per runtime for the GPT-2 decoding loop")
    ap.add_argument("--starts", type=int, default=5,
                    help="fresh processes per model and runtime timed for session creation + first run (median)")
    ap.add_argument("--only", nargs="+", metavar="NAME",
                    help="only the entries whose label contains one of these (light:, resnet50, batch=8, bert, gpt2)")
    ap.add_argument("--json", help="write everything, per-run latencies too, to this file")
    ap.add_argument("--list", action="store_true", help="list the suite's entries and exit")
    a = ap.parse_args(argv)
    console = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="glassrt-suite-") as workdir:
        every = entries(ModelFiles(workdir))
        if a.list:
            print("\n".join(e.label for e in every))
            return 0
        selected = [e for e in every if not a.only or any(n in e.label for n in a.only)]
        if not selected:
            console.print(f"[bold red]error:[/] no suite entry matches {' '.join(a.only)} (see --list)")
            return 1
        _compile_bytecode()
        try:
            bench.check_runtimes(bench.RUNTIMES)
        except bench.BenchError as e:
            console.print(f"[bold red]error:[/] {e}")
            return 1
        settings = bench.Settings(runtimes=bench.RUNTIMES, runs=a.runs, warmup=a.warmup, threads=a.threads,
                                  busy=a.busy, starts=max(1, a.starts))
        env = bench.environment()
        results, decoding = run_suite(selected, settings, a.rounds, console)
    full = bench.report(results, settings, env, decoding)
    print(markdown(full, settings))
    if a.json:
        Path(a.json).write_text(json.dumps(full, indent=1, default=str))
        console.print(f"wrote {a.json}")
    return 1 if any(r["error"] for r in results + decoding) else 0


if __name__ == "__main__":
    sys.exit(main())
