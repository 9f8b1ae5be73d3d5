"""Write docs/commands/: one page per ``ropelens`` command and an index table.

Each page says what the command answers, shows its ``--help`` text (formatted at a fixed width,
so the page does not depend on the terminal), one real invocation and the output it printed, and
the Python function that gives the same result. The invocations run in-process (``main(argv)``,
exactly what the ``ropelens`` executable calls) in a scratch folder.

    python scripts/command_pages.py                 # run every example, write every page
    python scripts/command_pages.py rope-spec knockout   # run only these, keep the others' runs
    python scripts/command_pages.py --help-only     # refresh help blocks, keep every recorded run

``tests/docs/test_pages.py`` checks that every command has a page and that each page's help block
equals the current ``--help`` (``help_text``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import ropelens
import ropelens.analyses
import ropelens.claims
import ropelens.report
from ropelens.analyses.registry import analyses
from ropelens.cli.main import build_parser, main
from ropelens.results.serialize import atomic_write_text

ROOT = Path(__file__).resolve().parent.parent
PAGES = ROOT / "docs" / "commands"
HELP_WIDTH = 100  # COLUMNS while formatting --help: pages and test agree whatever the terminal
REAL = "smollm2-135m"
TINY = "tiny-llama"
EXAMPLE_HEADING = "## Example"

# the tiny model directory the examples marked TINY read: a random 2-layer Llama (4 heads, head dim
# 16, context 1024) with a character tokenizer, as ropelens.testing builds it
TINY_SETUP = (
    "python -c 'from ropelens.testing import tiny_model_dir; "
    'tiny_model_dir("llama", "tiny-llama", max_position_embeddings=1024)\''
)
TRAJECTORY_SETUP = """python - <<'EOF'
from ropelens.training.train import TrainConfig, train
config = TrainConfig(d_model=32, n_layers=1, n_heads=2, head_dim=16, seq_len=32, batch_size=4,
                     steps=4, lr=1e-2, warmup=2, tokenizer="tiny-char", val_windows=4)
train(config, progress=False, checkpoint_dir="run", checkpoint_every=2)
EOF"""


@dataclass(frozen=True)
class Example:
    """One command's page: the question it answers and the invocation shown."""

    question: str
    argv: tuple[str, ...]
    model: str = REAL  # REAL, TINY or "" (the command loads no model)
    setup: tuple[str, ...] = ()  # shell lines the invocation needs, shown and run first
    where: str = ""  # what the run is on, where the model field does not say


def _ex(
    question: str, line: str, model: str = REAL, setup: tuple[str, ...] = (), where: str = ""
) -> Example:
    return Example(question, tuple(shlex.split(line)), model, setup, where)


_WINDOWS = "--tokens 1024 --n-ctx 128 --quiet"
EXAMPLES: dict[str, Example] = {
    "rope-spec": _ex(
        "What rotation does each attention layer of this model apply: its base, planes, pairing, "
        "score scale and wavelengths against the trained context?",
        "rope-spec",
    ),
    "report": _ex(
        "What does this model do with its frequencies, in one page: usage per plane, the band "
        "decomposition of its scores, positional heads, sinks, massive values, p-RoPE and context "
        "extension?",
        "report tiny-llama --quick --out report-a --quiet",
        TINY,
    ),
    "frequency-usage": _ex(
        "Which planes carry the energy of the queries and keys, layer by layer (Barbero et al.)?",
        f"frequency-usage --layers 0,1,2 {_WINDOWS}",
    ),
    "attention-decomposition": _ex(
        "For one text, how much of each head's attention logits comes from each band of "
        "frequencies?",
        "attention-decomposition --text 'The cat sat on the mat. The cat sat on the mat.' "
        "--layers 0,1 --bands quantiles:4 --quiet",
    ),
    "explore": _ex(
        "What would a head attend to if only some bands or planes rotated? (an interactive page)",
        "explore tiny-llama --text 'The cat sat on the mat. The cat sat on the mat.' "
        "--out mixer.html --quiet",
        TINY,
    ),
    "band-statistics": _ex(
        "Over a corpus, which band decides the attended key: its share of |logit|, of the "
        "within-query variance and of the attended-key margin?",
        f"band-statistics tiny-llama {_WINDOWS}",
        TINY,
    ),
    "head-taxonomy": _ex(
        "Which heads are positional (attend at a fixed offset on text and on random tokens), which "
        "sink, which read content, and which bands they use?",
        f"head-taxonomy --layers 0,1,2,3 {_WINDOWS}",
    ),
    "attention-sinks": _ex(
        "Which heads sink on the first token (ε = 0.3, Gu et al.), and which bands make that "
        "token attractive?",
        f"attention-sinks tiny-llama {_WINDOWS}",
        TINY,
    ),
    "attention-by-distance": _ex(
        "How do band logits and attention change with query-key distance: decaying, flat, "
        "U-shaped (HoPE), and which band makes the U?",
        f"attention-by-distance tiny-llama {_WINDOWS}",
        TINY,
    ),
    "massive-values": _ex(
        "Which pre-RoPE query and key dimensions are massive (Jin et al.), and in which planes?",
        f"massive-values tiny-llama {_WINDOWS}",
        TINY,
    ),
    "rotary-offsets": _ex(
        "Which planes never complete a turn in the trained context, and what angle do q and k "
        "keep in them at the attended key (Jonasson)?",
        f"rotary-offsets tiny-llama {_WINDOWS}",
        TINY,
    ),
    "positional-symbolic": _ex(
        "Is each head positional or symbolic (Urrutia et al.), and does that follow the "
        "frequencies it uses?",
        f"positional-symbolic tiny-llama {_WINDOWS}",
        TINY,
    ),
    "frequency-entropy": _ex(
        "Is each plane's query norm periodic along the sequence (low spectral entropy), as in "
        "RoPE layers, or flat, as in NoPE layers?",
        f"frequency-entropy tiny-llama {_WINDOWS}",
        TINY,
    ),
    "band-location": _ex(
        "Where is each layer's high-norm band (Oka et al.), and what does unrotating the planes "
        "below it cost?",
        f"band-location tiny-llama --eval-windows 2 {_WINDOWS}",
        TINY,
    ),
    "variant-frequencies": _ex(
        "What does a RoPE variant (p-RoPE, PI, NTK, YaRN, Llama 3, ...) do to every plane's "
        "frequency and wavelength?",
        "variant-frequencies --variant yarn:4:8192 --quiet",
    ),
    "intervention-effect": _ex(
        "What changes in frequency usage, band shares and head kinds when the model runs under "
        "a variant or with planes zeroed?",
        "intervention-effect tiny-llama --variant prope:0.5 --tokens 512 --n-ctx 128 --quiet",
        TINY,
    ),
    "prope-sweep": _ex(
        "What does truncating RoPE to its highest fraction p of frequencies (p-RoPE; p = 0 is "
        "NoPE) cost in perplexity at inference?",
        f"prope-sweep tiny-llama {_WINDOWS}",
        TINY,
    ),
    "pe-geometry": _ex(
        "How similar are position embeddings at a given distance, and with what period "
        "(learned absolute tables, the sinusoidal reference)?",
        "pe-geometry --quiet",
        "",
    ),
    "extension-planes": _ex(
        "Which planes does each context-extension method keep, interpolate or extrapolate, and "
        "is the base large enough for the target length?",
        "extension-planes --to 32768 --quiet",
    ),
    "base-predictions": _ex(
        "Is the model's base large enough for a context length (Men et al.), and where should "
        "it stop extrapolating (Liu et al.)?",
        "base-predictions --quiet",
    ),
    "passkey-retrieval": _ex(
        "Can the model retrieve a passkey hidden at a given depth of a given length?",
        "passkey-retrieval tiny-llama --lengths 320,640 --depths 0.25,0.75 --trials 2 --quiet",
        TINY,
    ),
    "retrieval-heads": _ex(
        "Which heads copy the needle (Wu et al.), and does zeroing their lowest-frequency planes "
        "break retrieval more than random planes (Bayram)?",
        "retrieval-heads tiny-llama --lengths 320,640 --depths 0.5 --trials 2 --top-k 2 --quiet",
        TINY,
    ),
    "extension-study": _ex(
        "Which context-extension method should I use for this model and target length: loss by "
        "length, passkey, per-plane view and base predictions side by side?",
        "extension-study tiny-llama --to 2048 --lengths 512,1024,2048 --windows 1 "
        "--passkey-lengths none --methods none,pi,yarn,prope --out study --quiet",
        TINY,
    ),
    "knockout": _ex(
        "Does zeroing a head set's highest (or lowest) planes change loss, positional behaviour "
        "and retrieval more than random planes and random heads, with CIs and p-values?",
        "knockout tiny-llama --heads 0.0,1.1 --probe-heads 0.0,1.1 --doses 2,4 "
        "--metrics loss,probe --tokens 512 --n-ctx 64 --random 2 --controls 2 --boot 200 --quiet",
        TINY,
    ),
    "claims": _ex(
        "Do the RoPE literature's claims (positional heads use the highest band, retrieval heads "
        "the lowest, sinks, massive values, p-RoPE, the base bound, ...) hold on this model, "
        "against fair controls?",
        "claims tiny-llama --budget quick --quiet",
        TINY,
        where="Run on the tiny random Llama: its random weights make no claim about trained "
        "weights hold, which is what the verdicts and their reasons say.",
    ),
    "trajectory": _ex(
        "When, over training, do the high-norm band, attention sinks, massive values and "
        "positional heads appear?",
        "trajectory run/step-000000 run/step-000002 run/step-000004 --tokens 96 --out trajectory "
        "--quiet",
        "",
        (TRAJECTORY_SETUP,),
        "Run on the checkpoints of a tiny Llama trained from scratch for four steps on the "
        "character tokenizer, saved every two steps by `ropelens.training.train.train`.",
    ),
    "compare": _ex(
        "What changed between two saved reports (B − A), map by map?",
        "compare report-a report-b --out compare",
        "",
        ("ropelens report tiny-llama --quick --variant prope:0.5 --out report-b --quiet",),
        "Run on two reports of the tiny random Llama directory of the [report](report.md) page: "
        "`report-a`, written there, and `report-b`, the same model under p-RoPE with p = 0.5.",
    ),
}


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every subcommand's parser, in the order of ``ropelens --help``."""
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return dict(sub.choices)


def help_text(name: str) -> str:
    """``ropelens NAME --help`` as printed on a terminal HELP_WIDTH columns wide."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(HELP_WIDTH)
    try:
        return command_parsers()[name].format_help().rstrip() + "\n"
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


# commands whose analysis declares no single function: the Python that gives the same result
PYTHON = {
    "explore": "ropelens.analyses.attention_decomposition(model, text).explore()",
    "variant-frequencies": "ropelens.rope_spec(model) inside "
    "ropelens.apply_rope_variant(model, variant)",
    "prope-sweep": "ropelens.run.evaluate.window_losses(model, windows) inside "
    "ropelens.apply_rope_variant(model, PRoPE(p))",
}


def python_name(name: str) -> str:
    """The public dotted name of the function behind command ``name`` (or the Python that gives
    its result, where its analysis declares no function)."""
    if name in PYTHON:
        return PYTHON[name]
    fn = next(a.function for a in analyses() if a.command is not None and a.command.name == name)
    for module in (ropelens, ropelens.analyses, ropelens.claims, ropelens.report):
        if getattr(module, fn.__name__, None) is fn:
            return f"{module.__name__}.{fn.__name__}"
    return f"{fn.__module__}.{fn.__qualname__}"


def summary(name: str) -> str:
    """The analysis's one-sentence summary (what ``ropelens --help`` and the index say)."""
    a = next(a for a in analyses() if a.command is not None and a.command.name == name)
    return a.summary or (a.command.run.__doc__ or "").strip().splitlines()[0]


def _run(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, _clean(err.getvalue()) + _clean(out.getvalue())


# a progress bar's line (tqdm writes them to stderr, redrawn with carriage returns)
_PROGRESS = re.compile(r"\d+%\||\x1b\[")


def _clean(text: str) -> str:
    """Output as a reader sees it once the command is done: progress bars dropped, trailing
    spaces stripped."""
    lines = (line.rstrip() for line in re.split(r"\r?\n", text))
    kept = [line for line in lines if not _PROGRESS.search(line) and "\r" not in line]
    return "\n".join(kept).strip("\n") + "\n" if any(kept) else ""


def _setup(line: str) -> None:
    if line.startswith("ropelens "):
        rc, text = _run(shlex.split(line)[1:])
        if rc:
            raise RuntimeError(f"{line} failed ({rc}): {text}")
    elif line.startswith("python - <<"):
        code = line.split("\n", 1)[1].rsplit("\nEOF", 1)[0]
        exec(compile(code, "<setup>", "exec"), {})  # our own setup code, shown on the page


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def _written(before: set[str], after: set[str]) -> str:
    new = sorted(after - before)
    if not new:
        return ""
    tops: dict[str, int] = {}
    for f in new:
        top = f.split("/", 1)[0] + ("/" if "/" in f else "")
        tops[top] = tops.get(top, 0) + 1
    listed = ", ".join(
        f"`{t}` ({n} files)" if t.endswith("/") else f"`{t}`" for t, n in tops.items()
    )
    return f"It wrote {listed}.\n"


def _where(ex: Example) -> str:
    if ex.where:
        return ex.where
    if ex.model == REAL:
        return "Run on the embedded SmolLM2-135M (the default model), on CPU, with small settings."
    if ex.model == TINY:
        return (
            "Run on a tiny random Llama saved as an HF directory (2 layers, 4 heads, head dim 16, "
            "context 1,024, character tokenizer): on the embedded SmolLM2 this command takes well "
            "over a minute on a CPU. Its numbers show the output's form, not findings. The "
            "directory comes from\n\n```bash\n" + TINY_SETUP + "\n```"
        )
    return "This command loads no model of its own."


def example_section(ex: Example, workdir: Path) -> str:
    """Run the example in ``workdir`` and return the page's example section."""
    for line in ex.setup:
        _setup(line)
    before = _files(workdir)
    start = time.perf_counter()
    rc, text = _run(list(ex.argv))
    seconds = time.perf_counter() - start
    if rc:
        raise RuntimeError(f"ropelens {shlex.join(ex.argv)} failed ({rc}):\n{text}")
    text = text.replace(str(workdir) + os.sep, "").strip()
    setup = ""
    if ex.setup:
        setup = "First:\n\n```bash\n" + "\n".join(ex.setup) + "\n```\n\n"
    return "".join(
        [
            f"{EXAMPLE_HEADING}\n\n",
            _where(ex),
            "\n\n",
            setup,
            f"```bash\nropelens {shlex.join(ex.argv)}\n```\n\n",
            f"```text\n{text}\n```\n\n" if text else "It prints nothing.\n\n",
            _written(before, _files(workdir)),
            f"It took {seconds:.0f} s on two CPU cores shared with other jobs.\n",
        ]
    )


def page(name: str, example: str) -> str:
    """The whole page of command ``name``, its example section given."""
    ex = EXAMPLES[name]
    return "".join(
        [
            f"# ropelens {name}\n\n",
            f"{ex.question} {summary(name)}\n\n",
            f"In Python: `{python_name(name)}`.\n\n",
            "## Help\n\n",
            f"```text\n{help_text(name)}```\n\n",
            example,
        ]
    )


def index() -> str:
    """docs/commands/index.md: one row per command."""
    rows = [
        "# Commands\n",
        "Every analysis of ropelens is a command of the `ropelens` executable (and of `python -m "
        "ropelens`). Each page below shows its `--help`, one real run and its output, and the "
        "Python function that gives the same result. Every command that loads a model takes "
        "`--device` and `--dtype`; `--json`, where a command has it, prints machine-readable "
        "output instead of a table; "
        "bad input ends in one `ropelens: error:` line naming the flag and the fix "
        "(exit code 2).\n",
        "| command | what it answers | Python function |",
        "|---|---|---|",
    ]
    for name in command_parsers():
        q = EXAMPLES[name].question.replace("|", "\\|")
        rows.append(f"| [`{name}`]({name}.md) | {q} | `{python_name(name)}` |")
    return "\n".join(rows) + "\n"


def recorded_example(name: str) -> str | None:
    """The example section of the page already written for ``name`` (None: no page yet)."""
    path = PAGES / f"{name}.md"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    at = text.find(f"\n{EXAMPLE_HEADING}\n")
    if at < 0:
        return None
    section = text[at + 1 :]
    # a section recorded before progress bars were dropped: drop them from its output block
    head, sep, rest = section.partition("```text\n")
    if sep:
        body, fence, tail = rest.partition("\n```\n")
        section = head + sep + _clean(body).rstrip("\n") + fence + tail
    return section.replace("```\n\n\n```", "```\n\n```")


def main_(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("commands", nargs="*", help="run only these (default: every command)")
    ap.add_argument("--help-only", action="store_true", help="rerun nothing; refresh help blocks")
    args = ap.parse_args(argv)
    names = list(command_parsers())
    missing = sorted(set(names) - set(EXAMPLES))
    if missing:
        raise SystemExit(f"no example for {', '.join(missing)}: add one to EXAMPLES")
    to_run = set() if args.help_only else set(args.commands or names)
    PAGES.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ropelens-pages-") as tmp:
        work = Path(tmp)
        here = Path.cwd()
        os.chdir(work)
        try:
            if any(EXAMPLES[n].model == TINY or n == "compare" for n in to_run):
                from ropelens.testing import tiny_model_dir

                tiny_model_dir("llama", work / TINY, max_position_embeddings=1024)
            if "compare" in to_run and "report" not in to_run:
                to_run.add("report")  # compare reads the report it writes
            for name in names:
                if name in to_run:
                    print(f"ropelens {name} ...", file=sys.stderr, flush=True)
                    try:
                        example = example_section(EXAMPLES[name], work)
                    except RuntimeError as e:  # the others still run; this page keeps its old run
                        print(e, file=sys.stderr)
                        failed.append(name)
                        example = recorded_example(name)
                        if example is None:
                            continue
                else:
                    example = recorded_example(name)
                    if example is None:
                        print(f"no run recorded for {name}: run this script with {name}")
                        continue
                atomic_write_text(PAGES / f"{name}.md", page(name, example))
        finally:
            os.chdir(here)
    atomic_write_text(PAGES / "index.md", index())
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main_())
