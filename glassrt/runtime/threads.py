"""How many threads a run uses: the requested number while that is fastest, one thread
while the machine is too busy for it.

The threads are the BLAS library's (and any OpenMP library's: oneDNN): they run each big
GEMM or convolution split into one static share per thread, and spin while they wait. On
a quiet machine that is the fastest there is. When other processes hold the cores, a
share whose thread is not running holds up the whole operation (measured on the 2-core
machine: a 1×768×2304 matmul 0.15 ms on one thread, 12 ms on two with the other core
busy), and the spinning steals time from the threads that could work. No single setting
wins both ways, so each plan keeps the recent latency it had with each thread count (the
median of its last runs) and runs with the faster one, trying the other now and then
(ThreadChoice), so a change of load is noticed soon.

A glassrt thread pool of its own, with dynamic scheduling and sleeping workers, was
measured first and dropped: waking a sleeping thread costs ~60 µs on these virtual
machines (Python's GIL hands over the same way), which made fine-grained kernels 2-8x
slower on a quiet machine.
"""
from __future__ import annotations

import os
import sys
import threading
import time

from ..kernels import gemm, run_threads

PROBE_EVERY = 16  # runs between two tries of the thread count not in use
FIRST_TRY = 64  # runs before the first try without a sign of load (a first one-thread try
# builds that count's oneDNN primitives: 110 ms once for inception_v2, whose runs take 30)
STARVED = 1.0  # CPU seconds per wall second below which a multi-thread run lacked its cores
PROBE_RUNS = 3  # runs in a row per try (the first is not measured)
PROBE_MAX_EVERY = 256  # the longest wait between tries, after tries that lost clearly
WINS_BY = 1.1  # a try must be this much faster than the count in use to replace it
LOST_BY = 1.25  # a try this much slower than the count in use doubles the wait before the next
ABANDON_BY = 2.0  # a try's measured run this much slower ends the try there (measured under load:
# two-thread tries of shufflenet at 40-200 ms a run against 9 on one thread were its p90)
SLOWER = 1.5  # the count in use this much slower than its best so far: try the other now
RECENT = 5  # measured runs per count whose median is its latency
TRY_AFTER_S = 0.5  # on fewer threads than requested: wall seconds before the requested count is
TRY_MAX_AFTER_S = 16.0  # tried again, whatever the runs; doubled by each such try that loses clearly
TINY_MS = 0.2  # a plan whose count in use runs faster than this is measured one run in QUIET_RUNS + 1:
QUIET_RUNS = 15  # its clocks, choice and bookkeeping (~2.4 us) were a quarter of a one-op model's run


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class ThreadChoice:
    """Per plan: the requested thread count or one, whichever ran it faster lately.

    A count's latency is the median of its last RECENT measured runs, so one slow run (the
    machine busy for a moment) moves nothing. Only a run whose previous run used the same
    count is measured: the first run after a switch pays for waking (or starting) the
    library's threads. So the other count is tried for PROBE_RUNS runs in a row, on fresh
    measurements (ending after the first where that is ABANDON_BY slower), and replaces the
    count in use only when WINS_BY faster. Tries come
    PROBE_EVERY runs after the last one (the first FIRST_TRY runs in); a try that loses
    clearly doubles that wait (up to PROBE_MAX_EVERY: on a quiet machine a one-thread try
    costs its runs' latency, which showed in p90). A sign of load brings the next try
    forward: the count in use slowing to SLOWER times its best, or its runs getting less
    than STARVED CPU seconds per second between all their threads (the main thread alone
    is always runnable, so a process under that did not get even one core); once a try
    has lost clearly under that load, only the count in use slowing SLOWER again since
    does (_worse_than_at_lost_try), else the backed-off wait. Load comes
    and goes by the clock, not by runs: on fewer threads than requested, the requested
    count is also tried TRY_AFTER_S after the last try, that time doubling (up to
    TRY_MAX_AFTER_S) while such tries lose clearly (measured: a benchmark that met a moment
    of load as its turns began ran every timed run of a small model on one thread,
    squeezenet 8.7-11 ms against ~5 on two, the next try 16 runs away)."""

    def __init__(self, requested: int, adaptive: bool = True, start: int | None = None):
        """start: the count to begin with (default the requested one): a session's new plan
        begins where its latest plan settled, so that a machine found busy is not
        rediscovered, at two threads' cost, by every new plan (each new shape)."""
        self.requested = max(1, int(requested))
        self.arms = (self.requested, 1) if self.requested > 1 and adaptive else (self.requested,)
        self.recent: dict[int, list] = {a: [] for a in self.arms}
        self._latency: dict[int, float] = {}  # the median of each count's recent runs (kept by record)
        self._warm: set = set()  # counts whose first measured run (still warming up) was dropped
        self.floor: dict[int, float] = {}  # the lowest latency each count has had
        self.current = start if start in self.arms else self.arms[0]
        self.runs = 0
        self.last = self.previous = None  # the counts of this run and the run before
        self._probing, self._probe_left = None, 0
        self._lost_at = None  # (count in use, its latency) when the last try lost clearly
        self.quiet = 0  # runs left before the next measured one (a tiny plan: TINY_MS)
        self.cpu: dict[int, list] = {a: [] for a in self.arms}  # CPU seconds per second of recent runs
        self._cpu_share: dict[int, float] = {}  # their median, kept by record
        self.wait, self._next_try, self._last_try = PROBE_EVERY, FIRST_TRY, -PROBE_EVERY
        self.clock = time.monotonic
        self._t_last_try, self.wait_s = self.clock(), TRY_AFTER_S

    def unmeasured(self) -> bool:
        """Whether this run goes unmeasured, on the count in use (a tiny plan between two
        measured runs: see TINY_MS). Tries, load signs and the clock's retries are judged on
        the measured runs alone, so for such a plan they come QUIET_RUNS + 1 times as many
        runs apart (a 50 us plan measured every 0.8 ms)."""
        if self.quiet:
            self.quiet -= 1
            return True
        return False

    def latency(self, arm: int) -> float | None:
        return self._latency.get(arm) if self.recent[arm] else None

    def choose(self) -> int:
        # (runs every run of every plan: a small model's run is tens of microseconds, so the
        # cheap tests come first and the medians are kept by record, not computed here)
        self.runs += 1
        if len(self.arms) == 1:
            n = self.arms[0]
        elif self._probe_left:
            self._probe_left -= 1
            n = self._probing
        else:
            if self._probing is not None:
                self._judge_try()
            if self.runs >= self._next_try or (self.runs - self._last_try >= PROBE_EVERY and self._loaded()
                                               and self._worse_than_at_lost_try()) or self._time_to_retry():
                n = next(a for a in self.arms if a != self.current)
                self._probing, self._probe_left = n, PROBE_RUNS - 1
                if n != self.current:
                    self.recent[n].clear()  # judged on this try's runs alone
                    self.cpu[n].clear()
            else:
                n = self.current
        self.previous, self.last = self.last, n
        return n

    def _time_to_retry(self) -> bool:
        """On fewer threads than requested, and wait_s since the last try (see the class doc)."""
        return self.current < self.requested and self.runs - self._last_try > PROBE_RUNS \
            and self.clock() - self._t_last_try >= self.wait_s

    def _loaded(self) -> bool:
        """Signs that other processes hold the cores the count in use needs."""
        now = self.latency(self.current)
        if now is not None and now > SLOWER * self.floor[self.current]:
            return True
        return self.current > 1 and len(self.cpu[self.current]) >= 3 and self._cpu_share[self.current] < STARVED

    def _worse_than_at_lost_try(self) -> bool:
        """Whether the count in use has slowed (SLOWER) since the last try, if that try lost
        clearly under the same load: load that stays brings no new tries of a count that
        lost under it, only the backed-off ones (before, a try every PROBE_EVERY runs, each
        its PROBE_RUNS runs on the slower count: simulated, a big model under steady load
        ran 284 of 1,800 runs on the losing count, 21 now; test_threads). A plan's first try
        under load still costs its PROBE_RUNS runs."""
        at = self._lost_at
        if at is None or at[0] != self.current:
            return True
        now = self.latency(self.current)
        return now is not None and now > SLOWER * at[1]

    def _judge_try(self) -> None:
        """After a try: switch when it won clearly; wait longer before the next when it lost clearly."""
        tried, self._probing = self._probing, None
        mine, now = self.latency(tried), self.latency(self.current)
        lost = False
        self._lost_at = None
        if tried != self.current and mine is not None and now is not None:
            if mine * WINS_BY < now:
                self.current = tried
                if tried < self.requested:  # a new spell on fewer threads: retried soon
                    self.wait_s = TRY_AFTER_S
            lost = mine > LOST_BY * now
            if lost:
                self._lost_at = (self.current, now)  # (the count kept, its latency then)
            if lost and tried == self.requested:
                self.wait_s = min(2 * self.wait_s, TRY_MAX_AFTER_S)
        self.wait = min(2 * self.wait, PROBE_MAX_EVERY) if lost else PROBE_EVERY
        self._last_try, self._next_try = self.runs, self.runs + self.wait
        self._t_last_try = self.clock()

    def record(self, seconds: float, cpu_seconds: float | None = None) -> None:
        """The latency (and the process's CPU time) of the run `choose` was last asked for;
        kept only when the run before it used the same count."""
        if self.previous != self.last:
            return
        if self.last not in self._warm:  # a count's first measured run may still touch new memory
            self._warm.add(self.last)
            return
        arm = self.last
        r = self.recent[arm]
        r.append(seconds * 1e3)
        del r[:-RECENT]
        if cpu_seconds is not None and seconds > 0:
            c = self.cpu[arm]
            c.append(cpu_seconds / seconds)
            del c[:-RECENT]
            self._cpu_share[arm] = _median(c)
        lat = self._latency[arm] = _median(r)
        self.floor[arm] = min(self.floor.get(arm, lat), lat)
        if arm == self._probing != self.current and self._probe_left:
            now = self.latency(self.current)
            if now is not None and lat > ABANDON_BY * now:
                self._probe_left = 0  # a try already lost by far: judged at the next run, not run on
        if arm == self.current and self._probing is None and len(r) >= 3 and lat < TINY_MS:
            self.quiet = QUIET_RUNS

    @property
    def best(self) -> int:
        return self.current

    def to_json(self) -> dict:
        out = {"requested": self.requested, "now": self.best, "runs": self.runs, "next_try_in": max(
                   0, self._next_try - self.runs) if len(self.arms) > 1 else None,
               "recent_ms_by_threads": {str(a): round(self.latency(a), 3) for a in sorted(self.arms)
                                        if self.recent[a]}}
        now = self.latency(self.current)
        if now is not None and now < TINY_MS:
            out["measured"] = f"one run in {QUIET_RUNS + 1} (runs under {TINY_MS} ms)"
        if fork_note():
            out["note"] = fork_note()
        return out


def _median(values: list) -> float:
    """statistics.median of a few numbers, without its generality (~1 us a call, per run)."""
    s = sorted(values)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


# ---------------------------------------------------------------- the libraries' thread counts

_lock = threading.Lock()
_controllers = None
_current = None
_pools_set = None  # the (n, openmp) threadpoolctl last set the libraries' pools for
_forked = False  # this process is a fork's child: its OpenMP runs one thread (see _after_fork)
_per_thread = threading.local()  # .omp: the OpenMP count this thread last set


def _after_fork() -> None:
    """GNU OpenMP is not fork-safe: a child forked after the parent ran a parallel region
    hangs in its first region with more than one thread (measured: a oneDNN conv in a
    multiprocessing-style fork child). So a child runs OpenMP on one thread."""
    global _forked, _current
    _forked, _current = True, None
    run_threads.count = 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def fork_note() -> str | None:
    if _forked:
        return ("this process was forked: OpenMP (oneDNN) runs one thread here, since GNU OpenMP's "
                "workers do not survive a fork")
    return None


def refresh() -> None:
    """Look for thread pools again (a provider loaded a library with one of its own)."""
    global _controllers, _current, _pools_set
    with _lock:
        _controllers, _current, _pools_set = None, None, None


def _find_controllers() -> list:
    try:
        from threadpoolctl import ThreadpoolController

        return [c for c in ThreadpoolController().lib_controllers if c.user_api in ("blas", "openmp")]
    except Exception:  # no threadpoolctl, or nothing it can drive: the libraries keep their own setting
        return []


def use_threads(n: int, openmp: bool = False, blas: bool = True) -> None:
    """The libraries' thread counts from now on. openmp=False: BLAS and any OpenMP library
    run n threads. openmp=True (a session with the onednn provider): OpenMP runs n threads,
    BLAS one, and the cpu kernels' float32 products go to oneDNN's sgemm on OpenMP's
    threads (kernels/gemm.py): one pool of spinning workers, not two. BLAS's count and the
    products' route are process-wide; OpenMP's count belongs to the calling thread (GNU
    OpenMP keeps it per thread), so each thread that runs a session sets its own.

    blas=False: the run calls no BLAS (a plan of oneDNN's kernels alone): the libraries are
    set through threadpoolctl only once some run needs it (its import and its scan of the
    loaded libraries took ~4 ms of a small model's first run); OpenMP's count is set here
    directly in any case."""
    global _controllers, _current, _pools_set
    omp = 1 if _forked else n
    if (n, openmp) == _current and getattr(_per_thread, "omp", None) == omp and (not blas or _pools_set == _current):
        return
    with _lock:
        if blas or _controllers is not None:
            if _controllers is None:
                _controllers = _find_controllers()
            for c in _controllers:
                c.set_num_threads(omp if c.user_api == "openmp" else (1 if openmp else n))
            _pools_set = (n, openmp)
        capi = sys.modules.get("glassrt.kernels.onednn.capi")
        if capi is not None and capi.lib is not None:
            capi.set_num_threads(omp)  # whether or not threadpoolctl found this libgomp
        gemm.use_openmp(openmp)
        run_threads.count = omp
        _current = (n, openmp)
        _per_thread.omp = omp
