"""tomlette: parse a practical subset of TOML into plain Python values."""

from tomlette.parser import TomlError, load, loads

__all__ = ["TomlError", "load", "loads"]
