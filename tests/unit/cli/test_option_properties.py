"""The option parsers over arbitrary strings: each returns a valid value or raises ropelens's one
user-facing error, InputError, in one line that names the flag and quotes the value typed; and the
real command, run in-process on bad options, exits 2 with one line on stderr."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ropelens.catalog.knockout import parse_heads
from ropelens.cli.common import number_list
from ropelens.cli.main import build_parser, main
from ropelens.cli.variant_syntax import parse_variant
from ropelens.errors import InputError
from ropelens.spec.bands import Bands
from ropelens.spec.variants import RopeVariant

# option values as users type them: digits, separators and letters, and any text at all
TYPED = st.one_of(
    st.text(alphabet="0123456789.,:=-+eE _abcnotruefalsyinquwvgh", max_size=24),
    st.text(max_size=16),
)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _one_line_naming(error: InputError, flag: str, typed: str, *, or_part: bool = False) -> None:
    """One line, the flag, and the value typed (``or_part``: or the comma-separated part of it
    that is wrong) quoted."""
    message = str(error)
    assert "\n" not in message, message
    assert flag in message, message
    quoted = {repr(typed), repr(typed.strip())}
    if or_part:
        quoted |= {repr(part.strip()) for part in typed.split(",")}
    assert any(q in message for q in quoted), message


@SETTINGS
@given(TYPED)
@example("yarn:4:2048:::::::true")
@example("yarn:4:2048:beta_fast=")
@example("prope:1e999")
@example("planemask:,")
def test_variant_parses_or_refuses_in_one_line(typed):
    try:
        variant = parse_variant(typed)
    except InputError as e:
        _one_line_naming(e, "--variant", typed)
    else:
        assert isinstance(variant, RopeVariant)


@SETTINGS
@given(TYPED)
@example("")
@example(",")
@example("3.1.2")
def test_heads_parses_or_refuses_in_one_line(typed):
    try:
        heads = parse_heads(typed)
    except InputError as e:
        _one_line_naming(e, "--heads", typed, or_part=True)
    else:
        assert heads and all(isinstance(h, int) and isinstance(i, int) for h, i in heads)


@SETTINGS
@given(TYPED)
@example("quantiles:")
@example("wavelength:10,,5")
@example("context:nan")
def test_bands_parses_or_refuses_in_one_line(typed):
    try:
        bands = Bands.parse(typed, flag="--bands")
    except InputError as e:
        _one_line_naming(e, "--bands", typed)
    else:
        assert isinstance(bands, Bands)


@SETTINGS
@given(TYPED)
@example(",")
@example("1e999")
@example("0,x")
def test_doses_parse_or_refuse_in_one_line(typed):
    try:
        doses = number_list(typed, float, "--doses", example="0,2,4,8")
    except InputError as e:
        _one_line_naming(e, "--doses", typed)
    else:
        assert doses and all(isinstance(d, float) for d in doses)


# flags whose values argparse's own type functions read, on commands that declare them
PARSED_FLAGS = [
    ("attention-by-distance", "--layers"),
    ("attention-by-distance", "--tokens"),
    ("attention-by-distance", "--n-ctx"),
    ("intervention-effect", "--ablate-planes"),
    ("intervention-effect", "--heads"),
]


@pytest.mark.parametrize(("command", "flag"), PARSED_FLAGS)
@SETTINGS
@given(typed=TYPED)
@example(typed="")
@example(typed=" ")
@example(typed="0")
@example(typed="1")
@example(typed="x")
@example(typed="1,,2")
@example(typed="--")
def test_parsed_flag_gives_its_value_or_one_line(command, flag, typed):
    parser = build_parser()
    try:
        args = parser.parse_args([command, f"{flag}={typed}"])
    except InputError as e:
        _one_line_naming(e, flag, typed)
    else:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if flag in ("--tokens", "--n-ctx"):
            assert isinstance(value, int) and value >= (2 if flag == "--n-ctx" else 1)
        else:
            assert value and all(isinstance(i, int) for i in value)


BAD_COMMANDS = [
    ["intervention-effect", "--ablate-planes", ""],
    ["knockout", "--heads", ""],
    ["knockout", "--heads", "3:1"],
    ["knockout", "--doses", ","],
    ["attention-by-distance", "--tokens", "0"],
    ["attention-by-distance", "--n-ctx", "1"],
    ["attention-by-distance", "--layers", "0,x"],
    ["attention-by-distance", "--bands", "quantiles:0"],
    ["attention-by-distance", "--variant", "yarn:4:2048:::::::true"],
    ["frequency-usage", "--variant", "prope:x"],
]


@pytest.mark.parametrize("argv", BAD_COMMANDS, ids=lambda argv: " ".join(argv))
def test_cli_refuses_a_bad_option_in_one_line(argv, capsys, monkeypatch):
    import ropelens.cli.common as common

    def no_model(*args, **kwargs):  # a bad option is refused before any model is loaded
        raise AssertionError(f"{argv} reached the model")

    monkeypatch.setattr(common, "load_model", no_model)
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ropelens: error: ")
    flag = next(a for a in argv if a.startswith("--"))
    assert flag in lines[0], lines[0]


def test_a_figure_name_a_result_does_not_draw_lists_the_names_it_does():
    from ropelens.analyses import FrequencyUsage
    from ropelens.results.figures import figure_of, registered_figures

    names = sorted(n for (cls, n) in registered_figures() if cls is FrequencyUsage)
    with pytest.raises(InputError) as e:
        figure_of(FrequencyUsage, "heatmapp")
    assert str(e.value) == (
        f"FrequencyUsage has no figure named 'heatmapp': choose one of "
        f"{', '.join(map(repr, names))}"
    )
    assert "register" not in str(e.value)
