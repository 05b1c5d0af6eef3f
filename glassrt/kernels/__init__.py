"""Kernels: implementations registered per provider against an op contract."""
from .registry import BindContext, Kernel, kernel  # noqa: F401
