"""The worker side of `glassrt bench`: one runtime, one model, one process.

glassrt.tools.bench starts it as `python .../glassrt/tools/bench_worker.py` and talks to it
over its stdin and stdout with multiprocessing's Connection framing (pickled messages).
Each runtime gets a process of its own because both keep idle worker threads spinning
after a run (onnxruntime's intra-op pool, OpenBLAS's threads): in one process they
would steal each other's cores, and their thread settings are process-wide.

Messages from the parent, each answered with ("ok", payload) or ("error", one line):
  {"runtime", "model", "threads", "providers", "feeds", "warmup"}
      creates the session, runs once, warms up; payload: timings, first outputs
  ("run", n)                          n timed runs; payload: latencies in seconds
  ("generate", feeds, steps, cache)   greedy decoding with a KV cache (see `generate`)
  ("info",)                           peak RSS and the BLAS libraries in use
  ("stop",)                           exits
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    # Run as a file, so that the onnxruntime worker never imports glassrt (its memory and
    # import time would be charged to onnxruntime). This folder is then first on the path,
    # where module names such as `profile` would shadow the standard library's: drop it.
    _here = os.path.dirname(os.path.realpath(__file__))
    sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != _here]

import resource  # noqa: E402
import time  # noqa: E402
from multiprocessing.connection import Connection  # noqa: E402


def _create(setup: dict):
    """The session and a run(feeds) -> list of outputs, for the runtime asked for."""
    if setup["runtime"] == "glassrt":
        import glassrt

        options = glassrt.SessionOptions(intra_op_num_threads=setup["threads"])
        # fallbacks are counted and shown in the report; warnings would only clutter stderr
        sess = glassrt.InferenceSession(setup["model"], providers=list(setup["providers"]), fallback="silent",
                                        sess_options=options)
        return sess, lambda feeds: sess.run(None, feeds)
    if setup["runtime"] == "onnxruntime":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = setup["threads"]
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        sess = ort.InferenceSession(setup["model"], so, providers=["CPUExecutionProvider"])
        return sess, lambda feeds: sess.run(None, feeds)
    raise ValueError(f"unknown runtime {setup['runtime']!r}")


def _import(runtime: str) -> float:
    """Seconds to import the runtime, kept out of the session creation time."""
    t0 = time.perf_counter()
    if runtime == "glassrt":
        import glassrt  # noqa: F401
    else:
        import onnxruntime  # noqa: F401
    return time.perf_counter() - t0


def start(setup: dict):
    """Create the session, time its creation and first run, then warm up."""
    import_s = _import(setup["runtime"])
    t0 = time.perf_counter()
    sess, run = _create(setup)
    create_s = time.perf_counter() - t0
    feeds = setup["feeds"]
    t0 = time.perf_counter()
    outputs = run(feeds)
    first_run_s = time.perf_counter() - t0
    for _ in range(setup["warmup"]):
        run(feeds)
    names = [o.name for o in sess.get_outputs()]
    fallbacks = len(getattr(sess, "fallbacks", []))
    return sess, run, {"import_s": import_s, "create_s": create_s, "first_run_s": first_run_s,
                       "output_names": names, "outputs": list(outputs), "fallbacks": fallbacks,
                       "rss_after_start_bytes": _peak_rss()}


def timed_runs(run, feeds, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        run(feeds)
        times.append(time.perf_counter() - t0)
    return times


def generate(run, output_names, feeds: dict, steps: int, cache: dict) -> dict:
    """Greedy decoding: run the prompt in `feeds` (its cache inputs empty), then `steps`
    one-token steps, each fed the argmax of the last logits and the previous step's
    present values as its past (`cache` maps an output name to the input it feeds)."""
    import numpy as np

    index = {name: i for i, name in enumerate(output_names)}
    t0 = time.perf_counter()
    outputs = run(feeds)
    prefill_s = time.perf_counter() - t0
    tokens, step_s = [], []
    for _ in range(steps):
        nxt = np.argmax(outputs[index["logits"]][:, -1, :], axis=-1).astype(np.int64)[:, None]
        tokens.append(nxt[:, 0])
        feeds = {"input_ids": nxt, **{past: outputs[index[present]] for present, past in cache.items()}}
        t0 = time.perf_counter()
        outputs = run(feeds)
        step_s.append(time.perf_counter() - t0)
    tokens.append(np.argmax(outputs[index["logits"]][:, -1, :], axis=-1))
    return {"tokens": np.stack(tokens, axis=1).tolist(), "prefill_s": prefill_s, "step_s": step_s}


def _peak_rss() -> int:
    """This process's peak resident memory. VmHWM first: Linux carries ru_maxrss over an
    exec, so a worker started by a parent that once held a big model would report the
    parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def info(sess=None) -> dict:
    from threadpoolctl import threadpool_info

    keep = ("user_api", "internal_api", "version", "architecture", "num_threads", "threading_layer", "prefix")
    return {"peak_rss_bytes": _peak_rss(),
            "threadpools": [{k: p.get(k) for k in keep} for p in threadpool_info()],
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
            "thread_choice": _thread_choice(sess)}


def _thread_choice(sess) -> list:
    """glassrt's per-plan thread choice as it stands (threads in use, recent latency per
    count, runs): a run that ended on one thread shows here. [] for onnxruntime."""
    plans = getattr(getattr(sess, "runner", None), "plans", None) or {}
    return [p.threads.to_json() for p in plans.values() if getattr(p, "threads", None) is not None]


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:400]}"


def serve(inbox: Connection, outbox: Connection) -> int:
    try:
        setup = inbox.recv()
    except EOFError:
        return 1
    try:
        sess, run, started = start(setup)
    except Exception as e:  # noqa: BLE001 - the runtime's own message, sent to the parent
        outbox.send(("error", _one_line(e)))
        return 1
    outbox.send(("ok", started))
    feeds = setup["feeds"]
    while True:
        try:
            msg = inbox.recv()
        except EOFError:  # the parent is gone
            return 0
        try:
            if msg[0] == "run":
                reply = timed_runs(run, feeds, msg[1])
            elif msg[0] == "generate":
                reply = generate(run, started["output_names"], *msg[1:])
            elif msg[0] == "info":
                reply = info(sess)
            elif msg[0] == "stop":
                return 0
            else:
                raise ValueError(f"unknown message {msg[0]!r}")
        except Exception as e:  # noqa: BLE001
            outbox.send(("error", _one_line(e)))
            continue
        outbox.send(("ok", reply))


def main() -> int:
    # The protocol owns the original stdin/stdout; fd 1 becomes stderr so that whatever a
    # library prints (Python or C) cannot corrupt the message stream.
    inbox = Connection(os.dup(0), writable=False)
    outbox = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return serve(inbox, outbox)


if __name__ == "__main__":
    sys.exit(main())
