"""The per-plan thread choice (runtime/threads.py), on simulated latencies."""
from __future__ import annotations

from glassrt.runtime.threads import PROBE_MAX_EVERY, ThreadChoice


class _Clock:
    """Simulated wall time: each run of _drive advances it by its latency."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _choice(*args, clock=None, **kwargs):
    c = ThreadChoice(*args, **kwargs)
    c.clock = clock or _Clock()
    c._t_last_try = c.clock()
    return c


def _drive(choice, latency, runs, cpu_share=None):
    """Run `runs` times; latency(run, threads) -> ms, cpu_share(run, threads) -> CPU seconds
    per second. Returns the counts used."""
    used = []
    for i in range(runs):
        n = choice.choose()
        ms = latency(i, n)
        if isinstance(choice.clock, _Clock):
            choice.clock.now += ms / 1e3
        choice.record(ms / 1e3, None if cpu_share is None else cpu_share(i, n) * ms / 1e3)
        used.append(n)
    return used


def test_a_quiet_machine_keeps_the_requested_count_and_tries_one_thread_rarely():
    used = _drive(_choice(2), lambda i, n: 10.0 if n == 2 else 18.0, 2000)
    assert used[-1] == 2
    assert used[200:].count(1) / len(used[200:]) < 0.03  # tries back off to every 256 runs


def test_load_arriving_moves_to_one_thread_soon_and_back_when_it_leaves():
    def latency(i, n):
        busy = 500 <= i < 1500
        return (40.0 if n == 2 else 20.0) if busy else (10.0 if n == 2 else 18.0)

    used = _drive(_choice(2), latency, 2500)
    assert used[499] == 2
    assert all(n == 1 for n in used[510:520])  # the slowdown brought the next try forward
    assert used[510:1500].count(1) > 0.9 * len(used[510:1500])
    assert used[1500 + PROBE_MAX_EVERY + 20:].count(2) > 0.9 * len(used[1500 + PROBE_MAX_EVERY + 20:])


def test_not_adaptive_is_one_count():
    assert set(_drive(_choice(2, adaptive=False), lambda i, n: 1.0, 100)) == {2}


def test_one_slow_run_now_and_then_does_not_move_a_quiet_plan_to_one_thread():
    """Another process's threads spinning for a moment (a benchmark's alternating turns, a
    cron job): single runs three times slower must not put the plan on one thread."""
    def latency(i, n):
        if n == 1:
            return 18.0
        return 30.0 if i % 6 == 0 else 10.0

    used = _drive(_choice(2), latency, 600)
    assert used[30:].count(2) > 0.95 * len(used[30:])


def test_the_first_runs_of_a_plan_warming_up_do_not_decide():
    """The first run (not measured) and the first measured run of a count may still be
    touching new memory or making primitives: they do not count."""
    used = _drive(_choice(2), lambda i, n: (60.0 if i < 2 else 10.0) if n == 2 else 18.0, 300)
    assert used[:3] == [2, 2, 2] and used[10:].count(2) > 0.95 * len(used[10:])


def test_a_process_busy_from_its_start_is_noticed_by_its_cpu_share():
    """Loaded from the first run: no faster past to slow down from, but the runs get less
    than one core between their two threads, so one thread is tried long before FIRST_TRY."""
    used = _drive(_choice(2), lambda i, n: 40.0 if n == 2 else 25.0, 60,
                  cpu_share=lambda i, n: 0.7 if n == 2 else 0.9)
    assert used[5:10] == [1] * 5 and used[10:].count(1) > 0.85 * 50  # tried after 3 measured runs, kept


def test_a_quiet_plan_does_not_try_one_thread_early():
    used = _drive(_choice(2), lambda i, n: 10.0 if n == 2 else 18.0, 60,
                  cpu_share=lambda i, n: 1.9 if n == 2 else 1.0)
    assert used == [2] * 60


def test_a_new_plan_starts_where_the_sessions_latest_plan_settled():
    """A session that found the machine busy starts each new plan (each new input shape) on
    one thread, and still goes back to two when that measures faster."""
    busy = ThreadChoice(2, start=1)
    assert busy.choose() == 1
    used = _drive(busy, lambda i, n: 10.0 if n == 2 else 18.0, 2000)  # the load has gone
    assert used[-1] == 2
    assert ThreadChoice(2, start=None).choose() == 2
    assert ThreadChoice(2, adaptive=False, start=1).choose() == 2  # not adaptive: always the request


def test_the_session_runner_hands_its_latest_choice_to_new_plans():
    import numpy as np
    from onnx import helper

    import glassrt

    from .helpers import model, tensor

    m = model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", ["n"])], [tensor("y", None)], opset=17)
    s = glassrt.InferenceSession(m, providers=["cpu"])
    s.run(None, {"x": np.ones(3, np.float32)})
    runner = s.runner
    first = next(iter(runner.plans.values()))
    first.threads.current = 1  # as if it had found one thread faster
    s.run(None, {"x": np.ones(3, np.float32)})
    assert runner.threads_hint == 1
    s.run(None, {"x": np.ones(5, np.float32)})  # a new shape: a new plan
    newest = runner.plans[next(reversed(runner.plans))]
    assert newest is not first and newest.threads.requested >= 1
    if newest.threads.requested > 1:
        assert newest.threads.current == 1


def test_on_one_thread_the_requested_count_is_retried_by_the_clock():
    """A moment of load put the plan on one thread; it left. The requested count is tried
    again TRY_AFTER_S later, not PROBE_EVERY runs later or more, and kept."""
    def latency(i, n):
        busy = 100 <= i < 130
        return (400.0 if n == 2 else 200.0) if busy else (10.0 if n == 2 else 18.0)

    used = _drive(_choice(2), latency, 300)
    assert used[116:130].count(1) >= 10  # the load moved it to one thread (a clock try lost meanwhile)
    back = next(i for i in range(130, 300) if used[i] == 2)
    assert back < 130 + 30  # a second after that lost try (its wait doubled), not 32 runs or more
    assert used[back + 5:].count(2) > 0.9 * len(used[back + 5:])


def test_under_steady_load_clock_tries_back_off():
    """Load that stays: each clock try loses clearly and doubles the wait, up to TRY_MAX_AFTER_S."""
    used = _drive(_choice(2), lambda i, n: 40.0 if n == 2 else 20.0, 3000,
                  cpu_share=lambda i, n: 0.7 if n == 2 else 0.9)
    assert used[100:].count(2) / len(used[100:]) < 0.03


def test_where_one_thread_is_simply_faster_the_clock_adds_few_tries():
    def latency(i, n):
        return 12.0 if n == 2 else 10.0  # a tiny model: one thread wins, not clearly

    clock = _drive(_choice(2), latency, 3000)
    runs = _choice(2)
    runs.clock = lambda: 0.0  # a clock that never moves: the run-based tries alone
    without = _drive(runs, latency, 3000)
    assert clock.count(2) <= 1.5 * without.count(2)


def test_load_that_stays_brings_no_new_tries_of_a_count_that_lost_under_it():
    """A big model under steady load: two threads stay faster (just slower than when quiet)
    and get less than a core each. A try of one thread loses clearly; the same load must not
    bring another every PROBE_EVERY runs (each try's runs are the slowest a server serves),
    only the backed-off tries; more load (two threads slowing again) does bring one."""
    def latency(i, n):
        if i < 100:
            return 40.0 if n == 2 else 70.0  # quiet
        if i < 2000:
            return 60.0 if n == 2 else 90.0  # three busy processes
        return 95.0 if n == 2 else 60.0  # more load: one thread now wins

    def cpu_share(i, n):
        return 1.9 if i < 100 and n == 2 else (0.8 if n == 2 else 0.95)

    used = _drive(_choice(2), latency, 2200, cpu_share=cpu_share)
    assert 1 in used[100:200]  # the load was noticed and one thread tried
    assert used[200:2000].count(1) / 1800 < 0.03, used[200:2000].count(1)
    assert used[2100:].count(1) > 0.9 * 100  # more load: tried again soon, and kept


def test_a_try_that_loses_by_far_ends_after_its_first_measured_run():
    """On one thread under load, a clock try of two threads whose first measured run is
    over twice as slow is judged there: two slow runs, not PROBE_RUNS (the first try three:
    a count's first measured run ever is a warm-up, not counted)."""
    choice = _choice(2, start=1)
    used = _drive(choice, lambda i, n: 45.0 if n == 2 else 9.0, 400,
                  cpu_share=lambda i, n: 0.6 if n == 2 else 0.9)
    spells = [len(s) for s in "".join(map(str, used)).split("1") if s]
    assert len(spells) >= 3 and spells[0] == 3 and all(n == 2 for n in spells[1:]), spells


def test_runs_while_numba_loads_leave_it_a_core_and_are_not_measured(monkeypatch):
    """While Numba loads on its thread (kernels/cpu/_jit.py), which holds a core, a run uses
    one core fewer than requested and ThreadChoice neither counts nor measures it; once
    the load is over runs are chosen and measured again."""
    import numpy as np
    from onnx import helper

    import glassrt
    from glassrt.runtime import runner as runner_module, threads

    from .helpers import model, tensor

    m = model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [4])], [tensor("y", None)], opset=17)
    so = glassrt.SessionOptions()
    so.intra_op_num_threads = 2
    s = glassrt.InferenceSession(m, so, providers=["cpu"])
    used = []
    real = threads.use_threads
    monkeypatch.setattr(threads, "use_threads", lambda n, *a, **k: (used.append(n), real(n, *a, **k)))
    monkeypatch.setattr(threads, "available_cpus", lambda: 2)
    loading = [True]
    monkeypatch.setattr(runner_module, "numba_loading", lambda: loading[0])
    x = {"x": np.ones(4, np.float32)}
    for _ in range(3):
        s.run(None, x)
    (plan,) = s.runner.plans.values()
    assert used == [1, 1, 1] and plan.threads.runs == 0 and not plan.threads.recent[2]
    loading[0] = False
    for _ in range(3):
        s.run(None, x)
    assert used[3:] == [2, 2, 2] and plan.threads.runs == 3 and plan.threads.recent[2]


def _drive_quietly(choice, latency, runs):
    """_drive as the runner drives a plan: a run `unmeasured` says is on the count in use, no clocks."""
    used, measured = [], 0
    for i in range(runs):
        if choice.unmeasured():
            n = choice.current
        else:
            n = choice.choose()
            choice.record(latency(i, n) / 1e3)
            measured += 1
        if isinstance(choice.clock, _Clock):
            choice.clock.now += latency(i, n) / 1e3
        used.append(n)
    return used, measured


def test_a_tiny_plan_is_measured_one_run_in_sixteen_and_still_leaves_a_starved_count():
    from glassrt.runtime.threads import QUIET_RUNS

    c = _choice(2)
    used, measured = _drive_quietly(c, lambda i, n: 0.05 if n == 2 else 0.08, 3200)
    assert used[-1] == 2 and measured < 3200 / (QUIET_RUNS + 1) * 1.3
    assert "one run in 16" in c.to_json()["measured"]
    # load arrives: two threads' runs take a time slice each now, one thread's stay tiny
    busy, _ = _drive_quietly(c, lambda i, n: 4.0 if n == 2 else 0.08, 400)
    assert busy[-200:].count(1) > 0.9 * 200


def test_a_plan_of_a_millisecond_is_measured_every_run():
    c = _choice(2)
    _, measured = _drive_quietly(c, lambda i, n: 1.0 if n == 2 else 1.6, 500)
    assert measured == 500 and "measured" not in c.to_json()
