"""Each actor's glass-box report, gathered where the driver can read it.

Ray Data gives a UDF no channel back to the driver besides its output rows (extra
columns would put the same report on every row of every batch) and `Dataset.stats()`
holds only Ray's own timings. So every Predictor actor sends its report — model,
providers, fallbacks (node, op, provider, reason), plan-cache counts, rows, run time — to
one small named actor, the collector, after each batch (replacing its previous one), and
the driver reads the reports of a run with `Predictor.stats(run)` or `collected(run)`.

The collector is named (`glassrt-stats` in namespace `glassrt`), so any process of the
cluster finds it (Ray Data actors, later Ray Serve replicas); it is detached, so it does
not die with the first actor that happened to create it, takes no CPU, and keeps the last
RUNS_KEPT runs. The report is sent synchronously: when the dataset has been consumed,
every batch's report has arrived (a lost fire-and-forget call would make the counts lie).
"""
from __future__ import annotations

import functools
from collections import OrderedDict

NAME, NAMESPACE = "glassrt-stats", "glassrt"
RUNS_KEPT = 64


class _Collector:
    """Reports by run, then by actor; the newest report of an actor replaces its older one."""

    def __init__(self):
        self._runs: OrderedDict[str, dict] = OrderedDict()

    def record(self, run: str, actor: str, report: dict) -> None:
        self._runs.setdefault(run, {})[actor] = report
        self._runs.move_to_end(run)
        while len(self._runs) > RUNS_KEPT:
            self._runs.popitem(last=False)

    def reports(self, run: str) -> list[dict]:
        return list(self._runs.get(run, {}).values())

    def clear(self, run: str) -> None:
        self._runs.pop(run, None)


@functools.lru_cache(maxsize=None)
def _remote_class():
    import ray

    return ray.remote(num_cpus=0)(_Collector)


def collector():
    """The cluster's collector actor, created on first use."""
    from . import require_ray

    require_ray("glassrt.ray's stats")
    return _remote_class().options(name=NAME, namespace=NAMESPACE, lifetime="detached",
                                   get_if_exists=True).remote()


def collected(run: str = "default") -> list[dict]:
    """Every actor's latest report for `run`, sorted by actor id."""
    import ray

    return sorted(ray.get(collector().reports.remote(run)), key=lambda r: r["actor"])


def clear(run: str = "default") -> None:
    import ray

    ray.get(collector().clear.remote(run))


def summarize(reports: list[dict]) -> dict:
    """Totals over the actors of a run: rows, batches, plans built, and each distinct
    fallback with the number of actors that reported it."""
    fallbacks: dict[tuple, int] = {}
    for r in reports:
        for f in r["fallbacks"]:
            key = (f["node"], f["op"], f["provider"], f["reason"])
            fallbacks[key] = fallbacks.get(key, 0) + 1
    return {"actors": len(reports), "rows": sum(r["rows"] for r in reports),
            "batches": sum(r["batches"] for r in reports), "plans_built": sum(r["plans_built"] for r in reports),
            "fallbacks": [{"node": n, "op": o, "provider": p, "reason": why, "actors": k}
                          for (n, o, p, why), k in fallbacks.items()]}
