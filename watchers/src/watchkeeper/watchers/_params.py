"""How a ready-made watcher declares its parameters: once, as a pydantic model.

Writing a ready-made watcher:

1. Declare its parameters as a :class:`WatcherParams` subclass, one field per parameter, in
   the order they may be given positionally, each with its type, its bounds (``Field(gt=0)``,
   or one of the shared types below: :data:`Seconds`, :data:`Count`, :data:`Text`...), its
   default, and a docstring under it saying what it does. Fields hold JSON types only (``str``,
   ``int``, ``float``, ``bool``, ``None``, lists, ``dict[str, ...]``; a ``mode="before"``
   validator turns a ``Path`` or a tuple into one): ``serialize()`` returns them as they
   are. Checks that need code are
   ``field_validator``/``model_validator`` methods; they raise ``ValueError`` for a bad value
   (``TypeError`` for a wrong kind of value, with :func:`owner` in the message).
2. Subclass :class:`ReadyMadeWatcher` with the model as ``params_model`` (and the model as its
   type argument, for mypy): ``class FooWatcher(ReadyMadeWatcher[FooParams])``. Set
   ``positional`` to how many parameters may be given by position (the rest are keyword-only)
   and ``client`` to ``(module, extra)`` when it needs a client library.
3. Read the values as ``self.params.<name>`` inside ``run()``. Values worked out from them
   (a compiled path, a quoted identifier) are set in ``__init__`` after ``super().__init__``.

The rest follows from the model: the constructor (``FooWatcher(*args, **kwargs)``), the
checks (a bad value raises ``TypeError`` or ``ValueError`` naming the watcher and the
parameter, and nothing is built), ``serialize()`` (the model's JSON, in declaration order, so
identical triggers serialize identically and run once; a parameter added to a watcher that
already shipped is named in the model's ``added_later`` and left out while at its default),
equality, and the parameter table of the documentation (``docs/_hooks.py``). A parameter
that may hold a secret (a URL with a password) is never quoted in an error: values are shown
only when they are numbers, booleans or short texts, and texts pass through
:func:`~watchkeeper.store.protocols.redact_secrets`.

Why a pydantic model rather than a dataclass with validators: the bounds declared on a field
(``gt``, ``ge``, ``min_length``, ``Literal``) are at once its check, in pydantic's compiled
validator, and its documentation, which ``docs/_hooks.py`` already renders for the settings
models; field docstrings become descriptions; strict mode refuses what the hand-written checks
refused. Its error texts are replaced by ours (:func:`_argument_error`), which name the watcher
and never quote a secret. Parameters stay flat keyword arguments, not nested groups
(a connection, a batch, a window): ``serialize()`` must keep the flat form of earlier versions,
since a trigger's identity is hashed from it, and one way to spell a watcher reads better than
two; the models group nothing either, as their field order is the positional order.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo
from watchkeeper.store.protocols import redact_secrets

from ._common import SerializedEquality

__all__ = [
    "Count",
    "OptionalText",
    "ReadyMadeWatcher",
    "Seconds",
    "SecondsOrZero",
    "Text",
    "WatcherParams",
    "owner",
    "text_list",
]

# NaN and infinities are refused by the models' ``allow_inf_nan=False``.
Seconds = Annotated[int | float, Field(gt=0)]
"""A duration in seconds, above zero (an ``int`` stays an ``int`` in ``serialize()``)."""
SecondsOrZero = Annotated[int | float, Field(ge=0)]
"""A duration in seconds, zero or more."""
Count = Annotated[int, Field(ge=1)]
"""A whole number of at least 1 (``bool`` is not a number here)."""
Text = Annotated[str, Field(min_length=1)]
"""A non-empty ``str``."""
OptionalText = Text | None
"""A non-empty ``str``, or ``None``."""


class WatcherParams(BaseModel):
    """The parameters of one ready-made watcher; subclass it with one field per parameter.

    Strict (no coercion: ``"1"`` is not a number, ``True`` not a count), frozen, closed to
    unknown names; each field's docstring is its description in the documentation.
    """

    model_config = ConfigDict(
        strict=True,
        frozen=True,
        extra="forbid",
        allow_inf_nan=False,
        use_attribute_docstrings=True,
        validate_default=False,
    )

    added_later: ClassVar[frozenset[str]] = frozenset()
    """Parameters added after the watcher first shipped: ``serialize()`` leaves each out while
    it holds its default, so the serialized form, a running trigger's identity, stays the one
    earlier versions wrote."""


def owner(info: ValidationInfo) -> str:
    """The name of the watcher being built, for messages raised inside a validator."""
    context = info.context
    return str(context.get("owner", "watcher")) if isinstance(context, dict) else "watcher"


def text_list(value: object, info: ValidationInfo, *, whole: str, each: str) -> list[str]:
    """``value`` (one ``str``, or a list or tuple of them) as a non-empty list of non-empty
    ``str``, for a ``mode="before"`` validator of a parameter that takes one name or several.

    The messages say what was expected in the parameter's own words: ``"<owner>: <whole>"``
    when ``value`` is no list, ``"<owner>: <each> must be a non-empty str"`` for a bad item.

    :raises TypeError: ``value`` is not of that shape.
    """
    if isinstance(value, str):
        value = [value]
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list) or not value:
        raise TypeError(f"{owner(info)}: {whole}")
    for item in value:
        if not isinstance(item, str) or not item:
            raise TypeError(f"{owner(info)}: {each} must be a non-empty str")
    return value


P = TypeVar("P", bound=WatcherParams)

_FOUND_CLIENTS: set[str] = set()
"""Client modules found installed once already (an installed module does not go away)."""


class ReadyMadeWatcher(SerializedEquality, Generic[P]):
    """A watcher whose parameters are declared once, by ``params_model``.

    ``ReadyMadeWatcher(*args, **kwargs)`` takes the model's fields, the first ``positional``
    of them also by position, checks them all and keeps them as :attr:`params`;
    :meth:`serialize` returns them as JSON. See this module's documentation for how to write
    one.
    """

    params_model: ClassVar[type[WatcherParams]]
    """The declaration of this watcher's parameters."""
    positional: ClassVar[int | None] = None
    """How many parameters may be given by position (``None``: all of them)."""
    client: ClassVar[tuple[str, str] | None] = None
    """``(module, extra)`` of the client library ``run()`` needs, checked on construction."""

    params: P
    """The checked parameters."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        model = cls.__dict__.get("params_model")
        if model is None:
            return
        if cls.__doc__:
            cls.__doc__ = _with_parameters(cls.__doc__, model)
        # What help(), inspect.signature() and editors show for the constructor.
        cls.__signature__ = _signature(model, cls.positional)  # type: ignore[attr-defined]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.params = self.build_params(args, kwargs)  # type: ignore[assignment]

    @classmethod
    def build_params(cls, args: tuple[Any, ...], kwargs: dict[str, Any]) -> WatcherParams:
        """The model of ``cls(*args, **kwargs)``; ``TypeError``/``ValueError`` naming what is
        wrong (the watcher and the parameter) when it does not validate."""
        name = cls.__name__
        if cls.client is not None and cls.client[0] not in _FOUND_CLIENTS:
            from ._broker import require_client

            require_client(name, *cls.client)  # finding a module on disk costs tens of µs
            _FOUND_CLIENTS.add(cls.client[0])
        fields = cls.params_model.__pydantic_fields__.keys()
        limit = len(fields) if cls.positional is None else cls.positional
        if len(args) > limit:
            raise TypeError(
                f"{name}() takes at most {limit} positional argument{'s' * (limit != 1)} "
                f"({len(args)} given)"
            )
        if args:
            values = dict(zip(fields, args, strict=False))
            for key in kwargs.keys() & values.keys():
                raise TypeError(f"{name}() got multiple values for argument {key!r}")
            values.update(kwargs)
        else:
            values = kwargs
        try:
            return cls.params_model.model_validate(values, context={"owner": name})
        except ValidationError as exc:
            error = _argument_error(name, exc)
        # Raised here, not inside the except: pydantic's error quotes the values given, a URL's
        # password among them, and must not travel along as the context.
        raise error

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """``(classpath, kwargs)``: every parameter, as JSON, in declaration order."""
        # The fields hold JSON values already (the models declare only JSON types): a copy of
        # them, lists and mappings copied too, is the JSON form without a serializer's cost.
        params = self.params
        later = params.added_later
        fields = type(params).__pydantic_fields__
        return self.classpath(), {
            name: list(value)
            if type(value) is list
            else dict(value)
            if type(value) is dict
            else value
            for name, value in params.__dict__.items()
            if not later or name not in later or value != fields[name].default
        }

    if not TYPE_CHECKING:  # for mypy, parameters are read as ``self.params.<name>``

        def __getattr__(self, name: str) -> Any:
            """``watcher.<parameter>`` reads ``watcher.params.<parameter>`` (earlier versions
            kept each parameter as an attribute of the watcher)."""
            params = self.__dict__.get("params")
            if params is not None and name in type(params).__pydantic_fields__:
                return getattr(params, name)
            # Not a parameter: the lookup's own error (a property's, such as
            # asset_state_store's outside run(), or the plain one).
            return object.__getattribute__(self, name)


def _signature(model: type[WatcherParams], positional: int | None) -> inspect.Signature:
    """The constructor's signature: the model's fields, the first ``positional`` by position."""
    parameters = []
    for index, (name, info) in enumerate(model.model_fields.items()):
        by_position = positional is None or index < positional
        kind = (
            inspect.Parameter.POSITIONAL_OR_KEYWORD
            if by_position
            else inspect.Parameter.KEYWORD_ONLY
        )
        default = (
            inspect.Parameter.empty
            if info.is_required()
            else info.get_default(call_default_factory=True)
        )
        parameters.append(
            inspect.Parameter(name, kind, default=default, annotation=info.annotation)
        )
    return inspect.Signature(parameters)


def _with_parameters(doc: str, model: type[WatcherParams]) -> str:
    """``doc`` with a ``:param name: ...`` line per field of ``model``, before its ``:raises``
    lines (or at its end)."""
    text = inspect.cleandoc(doc)
    lines = []
    for name, info in model.model_fields.items():
        lines.append(f":param {name}: {' '.join((info.description or '').split())}")
    head, found, tail = text.partition("\n:raises")
    return "\n".join([head.rstrip(), "", *lines, *([found.lstrip("\n") + tail] if found else [])])


# -- errors -------------------------------------------------------------------------------------

_TYPE_ERRORS = {
    "int_type": "must be an int",
    "float_type": "must be a number",
    "string_type": "must be a str",
    "bool_type": "must be a bool",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "missing": "is required",
    "extra_forbidden": "is not a parameter of this watcher",
}


def _describe(error: Mapping[str, Any]) -> tuple[str, bool]:
    """``(what is wrong, is it a type error)`` for one pydantic error."""
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind in _TYPE_ERRORS:
        return _TYPE_ERRORS[kind], True
    if kind == "value_error":
        return str(ctx.get("error", error["msg"])), False
    if kind == "greater_than":
        return f"must be greater than {ctx['gt']}", False
    if kind == "greater_than_equal":
        return ("must be 0 or more" if ctx["ge"] == 0 else f"must be at least {ctx['ge']}"), False
    if kind == "less_than_equal":
        return f"must be at most {ctx['le']}", False
    if kind == "finite_number":
        return "must be finite", False
    if kind in ("string_too_short", "too_short"):
        return "must not be empty", False
    if kind == "literal_error":
        return f"must be {ctx['expected']}", False
    return str(error["msg"]), False


def _shown(value: Any, is_type: bool) -> str:
    if is_type:
        return type(value).__name__
    if isinstance(value, str):
        return repr(redact_secrets(value)) if len(value) <= 200 else "a long str"
    if isinstance(value, bool | int | float):
        return repr(value)
    return type(value).__name__


def _argument_error(name: str, exc: ValidationError) -> Exception:
    """One ``TypeError`` or ``ValueError`` for every bad parameter of ``exc``."""
    by_field: dict[str, list[Mapping[str, Any]]] = {}
    for error in exc.errors(include_url=False):
        field = str(error["loc"][0]) if error["loc"] else ""
        by_field.setdefault(field, []).append(error)
    problems: list[str] = []
    type_error = False
    for field, errors in by_field.items():
        # Of a union's errors (an int or a float), a bound broken beats "not an int".
        described = [(_describe(error), error) for error in errors]
        values = [d for d in described if not d[0][1]]
        numbers = [d for d in described if d[1]["type"] == "float_type"]
        (message, is_type), chosen = (values or numbers or described)[0]
        type_error = type_error or is_type
        if chosen["type"] == "value_error":
            problems.append(message.removeprefix(f"{name}: "))
            continue
        where = field + "".join(
            f"[{part!r}]" for part in chosen["loc"][1:2] if isinstance(part, int)
        )
        text = f"{where} {message}"
        if chosen["type"] not in ("missing", "extra_forbidden"):
            text += f", got {_shown(chosen.get('input'), is_type)}"
        problems.append(text)
    cls = TypeError if type_error else ValueError
    return cls(f"{name}: {'; '.join(problems)}")
