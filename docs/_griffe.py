"""A griffe extension: the ready-made watchers as Python holds them at run time.

Their constructors take the fields of their parameter models, and their ``:param ...:`` lines
are written from those models when the classes are created (``watchkeeper.watchers._params``),
so the source text has neither; this extension gives the reference page the docstring and the
constructor signature each class has once imported.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import griffe


class RuntimeWatcherDocstrings(griffe.Extension):
    """Each ready-made watcher class: its run-time ``__doc__`` and ``__init__`` parameters."""

    def on_class_members(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        if not cls.path.startswith("watchkeeper.watchers.") or cls.docstring is None:
            return
        from watchkeeper.watchers._params import ReadyMadeWatcher

        runtime = getattr(importlib.import_module(cls.module.path), cls.name, None)
        if not (isinstance(runtime, type) and issubclass(runtime, ReadyMadeWatcher)):
            return
        if runtime.__doc__:
            cls.docstring.value = inspect.cleandoc(runtime.__doc__)
        parameters = [griffe.Parameter("self", kind=griffe.ParameterKind.positional_or_keyword)]
        for parameter in inspect.signature(runtime).parameters.values():
            required = parameter.default is inspect.Parameter.empty
            parameters.append(
                griffe.Parameter(
                    parameter.name,
                    kind=griffe.ParameterKind(parameter.kind.description),
                    default=None if required else repr(parameter.default),
                )
            )
        init = griffe.Function("__init__", parameters=griffe.Parameters(*parameters))
        cls.set_member("__init__", init)
