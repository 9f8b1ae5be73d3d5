"""RoPE variants as a command line spells them: ``--variant yarn:factor=4``, parsed into a
:class:`ropelens.spec.variants.RopeVariant`, and the help that lists every variant with an
example."""

from __future__ import annotations

import dataclasses

from ropelens.errors import InputError
from ropelens.spec import variants as V

__all__ = ["VARIANT_EXAMPLES", "parse_variant", "variant_help"]


def _variant_classes() -> dict[str, type[V.RopeVariant]]:
    """The variant classes :mod:`ropelens.spec.variants` exports, by lower-case class name, in its
    order."""
    exported = (getattr(V, n) for n in V.__all__)
    return {
        c.__name__.lower(): c
        for c in exported
        if isinstance(c, type) and issubclass(c, V.RopeVariant) and c is not V.RopeVariant
    }


def _params(cls: type[V.RopeVariant]) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.init]


def variant_help() -> str:
    """The variant forms ``--variant`` accepts, e.g. ``prope:P``; values in [brackets] have
    defaults."""
    return ", ".join(_form(name, cls) for name, cls in _variant_classes().items())


def _form(name: str, cls: type[V.RopeVariant]) -> str:
    parts = [name]
    for f in _params(cls):
        value = f.name.upper()
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        parts.append(value if required else f"[{value}]")
    return ":".join(parts)


# A value of each variant that parse_variant accepts, shown in its error messages (tested to parse).
VARIANT_EXAMPLES = {
    "default": "default",
    "prope": "prope:0.75",
    "propereversed": "propereversed:0.75",
    "propepartial": "propepartial:0.75",
    "nope": "nope",
    "basechange": "basechange:500000",
    "planemask": "planemask:0,1,2,3",
    "linear": "linear:4",
    "ntk": "ntk:4",
    "dynamicntk": "dynamicntk:2:2048",
    "yarn": "yarn:4:2048",
    "llama3": "llama3:8:1:4:8192",
    "longrope": "longrope:1,1,1,1:1,2,4,8:2048",
    "resonance": "resonance:4:2048",
    "cope": "cope:20",
    "fopezero": "fopezero:2048",
}


def _example(name: str) -> str:
    return VARIANT_EXAMPLES.get(name, name)


def _value(text: str, f: dataclasses.Field, spec: str, name: str, flag: str):
    kind = str(f.type)
    if (
        "None" in kind and text == "none"
    ):  # an optional value left at its default, to reach a later one
        return None
    if "tuple" in kind or "list" in kind:  # per-plane lists: comma-separated
        item, want = (
            (int, "a comma-separated list of integers")
            if "int" in kind
            else (float, "a comma-separated list of numbers")
        )
    elif kind.startswith("bool"):
        item, want = None, "true or false"
    elif kind.startswith("int"):
        item, want = int, "an integer"
    else:
        item, want = float, "a number"
    listed = "tuple" in kind or "list" in kind
    tokens = [x.strip() for x in text.split(",") if x.strip()] if listed else [text]
    bad = next((t for t in tokens if not _parses(t, item)), None if tokens else text)
    if bad is not None:
        where = f"{bad!r} in {text!r}" if listed and bad != text else repr(text)
        form = _form(name, _variant_classes()[name])
        if not text.strip():
            raise InputError(
                f"{flag} {spec!r}: {f.name.upper()} is empty: values go in order ({form}) or by "
                f"name as KEY=VALUE, e.g. {flag} {_example(name)}:{f.name}=VALUE; leave an "
                "optional value out rather than empty"
            )
        raise InputError(
            f"{flag} {spec!r}: bad {f.name.upper()} {where}: {f.name.upper()} must be {want}: "
            f"write {form} or by name ({f.name}=VALUE), e.g. {flag} {_example(name)}"
        )
    if item is None:
        return text == "true"
    values = tuple(item(t) for t in tokens)
    return values if listed else values[0]


def _parses(token: str, item: type | None) -> bool:
    """Whether ``token`` reads as ``item`` (None: a bool written true or false)."""
    if item is None:
        return token in ("true", "false")
    try:
        item(token)
    except ValueError:
        return False
    return True


def parse_variant(text: str, flag: str = "--variant") -> V.RopeVariant:
    """``"prope:0.75"`` → ``PRoPE(0.75)``: a variant's class name and its values.

    The name is in any case, '-' ignored, or a unique prefix. Values are given in order
    (``yarn:4:2048``), by name (``yarn:factor=4``), or in order and then by name. Errors name
    ``flag``, the bad token and the form of the variant, with an example that parses.
    """
    name, *values = text.strip().lower().split(":")
    name, cls = _variant_class(name, text, flag)
    params = _params(cls)
    required = [f.name for f in params if _required(f)]
    given = _given_values(values, params, text, name, flag)
    missing = [n for n in required if n not in given]
    if missing or len(values) > len(params):
        counts = (
            f"{len(required)}"
            if len(required) == len(params)
            else f"{len(required)} to {len(params)}"
        )
        lacking = f" (missing {', '.join(missing)})" if missing else ""
        raise InputError(
            f"{flag} {text!r}: {name} takes {counts} value(s) after the name, "
            f"got {len(values)}{lacking}: "
            f"write {_form(name, cls)}, e.g. {flag} {_example(name)}"
        )
    try:
        return cls(**given)
    except (
        InputError
    ) as e:  # a value out of its range (p > 1, a factor ≤ 0, lists of unequal lengths)
        raise InputError(f"{flag} {text!r}: {e}: e.g. {flag} {_example(name)}") from e


def _required(field: dataclasses.Field) -> bool:
    """Whether a variant's value has no default (it must be given)."""
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def _variant_class(name: str, text: str, flag: str) -> tuple[str, type[V.RopeVariant]]:
    """The variant class ``name`` spells: its full name or a unique prefix ('-', '_' ignored)."""
    classes = _variant_classes()
    key = name.replace("-", "").replace("_", "")
    matches = [key] if key in classes else [n for n in classes if key and n.startswith(key)]
    if len(matches) != 1:
        raise InputError(
            f"{flag}: unknown variant {text!r}: write NAME:VALUE:..., "
            f"e.g. {flag} {_example('yarn')}; "
            f"use one of {variant_help()}"
        )
    return matches[0], classes[matches[0]]


def _given_values(
    values: list[str], params: list[dataclasses.Field], text: str, name: str, flag: str
) -> dict[str, object]:
    """The values after the name, by field: in order (``4:2048``), then by name (``factor=4``)."""
    by_name = {f.name.lower(): f for f in params}
    given: dict[str, object] = {}
    named_seen = False
    for position, value in enumerate(values):
        key, named, raw = value.partition("=")
        if named:
            named_seen = True
            field = by_name.get(key.strip())
            if field is None:
                known = ", ".join(by_name) or "none"
                raise InputError(
                    f"{flag} {text!r}: {name} has no value named {key.strip()!r} (its values: "
                    f"{known}): write {_form(name, _variant_classes()[name])}, "
                    f"e.g. {flag} {_example(name)}"
                )
        elif named_seen:
            raise InputError(
                f"{flag} {text!r}: {value!r} follows a named value: give values in order first, "
                f"then by name, e.g. {flag} yarn:4:original_max_position=2048"
            )
        elif position >= len(params):
            continue  # one value too many: parse_variant says how many the variant takes
        else:
            field, raw = params[position], value
        if field.name in given:
            raise InputError(f"{flag} {text!r}: {field.name} is given twice: give it once")
        given[field.name] = _value(raw.strip(), field, text, name, flag)
    return given
