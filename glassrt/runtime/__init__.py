"""The runtime: inference, placement, kernel selection, memory planning, plans, sessions."""

_cpu_loaded = False


def _load_cpu_kernels():
    """Import every cpu kernel module once (their decorators fill the registry)."""
    global _cpu_loaded
    if not _cpu_loaded:
        _cpu_loaded = True
        import glassrt.kernels.cpu  # noqa: F401
