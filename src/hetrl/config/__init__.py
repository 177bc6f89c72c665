"""Typed recipe configuration (torch-free: safe to import on a login node)."""

from hetrl.config.loader import ConfigError, load_config, save_resolved
from hetrl.config.schema import HetrlConfig

__all__ = ["ConfigError", "HetrlConfig", "load_config", "save_resolved"]
