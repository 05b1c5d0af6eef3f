"""The runtime: inference, placement, kernel selection, memory planning, plans, sessions."""


def _load_cpu_kernels(domain: str | None = None, op_type: str | None = None):
    """Import the cpu kernel modules (their decorators fill the registry): those an op
    needs, or every one when no op is named."""
    from ..kernels import cpu

    if op_type is None:
        cpu.load_all()
    else:
        cpu.load_for(domain, op_type)


def _load_kernels(provider: str, domain: str, op_type: str) -> None:
    """Import the kernel modules a provider registers (domain, op_type)'s kernels from,
    where that provider's modules are imported per op (cpu, onednn)."""
    if provider == "cpu":
        _load_cpu_kernels(domain, op_type)
    elif provider == "onednn":
        from ..kernels.onednn import FAMILIES

        FAMILIES.load_for(domain, op_type)
