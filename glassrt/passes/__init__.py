"""Graph passes: Graph → Graph', each logged so `explain` can say what changed."""
from __future__ import annotations

from .dead_code import remove_dead_code

PASSES = [remove_dead_code]


def run_passes(graph):
    log = []
    for p in PASSES:
        graph, note = p(graph)
        if note:
            log.append(f"{p.__name__}: {note}")
    return graph, log
