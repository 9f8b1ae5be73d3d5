"""A variant class passed where a variant goes is refused in one line that names the class and how
to instantiate it; no refusal quotes a model's repr."""

from __future__ import annotations

import dataclasses

import pytest

from ropelens import apply_rope_variant, with_rope_variant
from ropelens.analyses import intervention_effect
from ropelens.errors import InputError
from ropelens.spec import variants as V
from ropelens.validate import SHOWN_CHARS, check_number

VARIANT_CLASSES = [getattr(V, name) for name in V.__all__ if name[0].isupper()]
VARIANT_CLASSES = [c for c in VARIANT_CLASSES if c is not V.RopeVariant]


def _one_line(message: str) -> str:
    assert "\n" not in message and len(message) < 300, message
    return message


@pytest.mark.parametrize("cls", VARIANT_CLASSES, ids=lambda c: c.__name__)
def test_a_variant_class_is_refused_naming_it_and_its_instance(cls, tiny):
    model = tiny("llama")
    with pytest.raises(TypeError) as applied, apply_rope_variant(model, cls):
        pass
    with pytest.raises(TypeError) as copied:
        with_rope_variant(model, cls)
    message = _one_line(str(applied.value))
    assert str(copied.value) == message
    assert message.startswith(f"expected a RoPE variant, got the class {cls.__name__}: instantiate")
    example = message.rsplit("e.g. ", 1)[1]
    built = eval(example, vars(V))  # the example the refusal gives builds the variant
    assert type(built) is cls
    needed = [f for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
    assert ("with its parameters" in message) == bool(needed)


def test_the_base_class_is_refused_as_such(tiny):
    with pytest.raises(TypeError, match="got the base class RopeVariant: pass one of its variants"):
        with_rope_variant(tiny("llama"), V.RopeVariant)


def test_a_variant_class_given_the_model_is_refused_without_its_repr(tiny):
    """``PRoPE(model)``: what ``intervention_effect(model, PRoPE)`` did with the class, a callable,
    before it was refused; the model's repr ran to 14 KB."""
    model = tiny("llama")
    assert len(repr(model)) > 10_000
    with pytest.raises(InputError) as built:
        V.PRoPE(model)
    assert _one_line(str(built.value)) == (
        f"PRoPE was given a model ({type(model).__name__}) as its p: a variant is made from its "
        "parameters, e.g. PRoPE(0.75), and passed beside the model, e.g. "
        "apply_rope_variant(model, PRoPE(0.75))"
    )
    for cls in (V.PRoPE, V.YaRN, V.NoPE):
        with pytest.raises(TypeError, match=f"got the class {cls.__name__}: instantiate it"):
            intervention_effect(model, cls, n_ctx=16, max_tokens=32, progress=False)


def test_a_number_check_names_a_long_value_by_its_type(tiny):
    model = tiny("llama")
    with pytest.raises(InputError) as checked:
        check_number(model, "p")
    assert str(checked.value) == f"p must be a finite number, got a {type(model).__name__}"
    with pytest.raises(InputError, match=r"got 'x{80}'…$"):
        check_number("x" * (SHOWN_CHARS + 20), "p")
    with pytest.raises(InputError, match=r"got 'half'$"):  # a short value is quoted as typed
        check_number("half", "p")
