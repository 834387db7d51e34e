"""A package's exported names loaded from their modules on first use, not when the package is
(PEP 562): ``batchlab simulate`` starts its report process before it loads numpy, pyarrow
and the engine, and importing a package for one light module must not load them all.

    __getattr__ = names_on_first_use(__name__, globals(), {"simulate": "driver", ...})

Each name maps to the module of the package it lives in. A name is looked up there once and
kept in the package's namespace; a name not in the map is an AttributeError, as usual.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def names_on_first_use(package: str, namespace: dict[str, Any],
                       home: Mapping[str, str]) -> Callable[[str], Any]:
    """The package's module-level ``__getattr__``: ``namespace`` is its ``globals()``,
    ``home`` each exported name's module (``"driver"`` for ``package.driver``)."""
    def __getattr__(name: str) -> Any:
        module = home.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value  # found there from now on, without this call
        return value

    return __getattr__
