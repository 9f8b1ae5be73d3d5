"""Training trajectories: checkpoints saved by train, hub revisions, the trajectory table,
emergence, figure, page and CLI."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ropelens.analyses.trajectory import ANALYSES, STRUCTURES, Checkpoint, Trajectory, trajectory
from ropelens.errors import InputError
from ropelens.loading import models
from ropelens.loading.checkpoints import read_info, step_of
from ropelens.loading.models import load_model
from ropelens.results.provenance import Provenance
from ropelens.results.result import load_result
from ropelens.run import data
from ropelens.spec.variants import PRoPE
from ropelens.testing import tiny_hf_model, tiny_model_dir, tiny_tokenizer
from ropelens.training.train import TrainConfig, build_model, token_streams, train

TINY = TrainConfig(
    d_model=32,
    n_layers=1,
    n_heads=2,
    head_dim=16,
    seq_len=32,
    batch_size=4,
    steps=4,
    lr=1e-2,
    warmup=2,
    tokenizer="tiny-char",
    val_windows=4,
    seed=0,
)


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("ROPELENS_DEBUG", raising=False)  # it turns error lines into tracebacks


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny model trained for 4 steps with a checkpoint every 2: (directory, result, final
    model)."""
    d = tmp_path_factory.mktemp("run")
    result, model = train(
        TINY, progress=False, return_model=True, checkpoint_dir=d, checkpoint_every=2
    )
    return d, result, model


@pytest.fixture(scope="module")
def traj(run):
    d, _, _ = run
    return trajectory(sorted(d.glob("step-*")), n_tokens=96)


def _logits(model, ids):
    hf = getattr(model, "original_model", model)
    with torch.no_grad():
        return hf(input_ids=ids).logits


def _ids():
    train_ids, _, _, bos = token_streams(TINY.corpus, TINY.tokenizer, TINY.val_fraction)
    return torch.cat([torch.tensor([bos]), train_ids[:31]])[None]


# ---------------------------------------------------------------------------- load_model(revision=)
def test_revision_refused_for_local_paths_and_embedded_models(tmp_path):
    path = tiny_model_dir("llama", tmp_path / "tiny")
    with pytest.raises(InputError, match="which is a local path"):
        load_model(path, revision="main", device="cpu")
    with pytest.raises(InputError, match="which is an embedded model"):
        load_model("smollm2-135m", revision="main", device="cpu")
    with pytest.raises(InputError, match="local path"):
        load_model(tmp_path / "missing", revision="main", device="cpu")
    with pytest.raises(InputError, match="non-empty string"):
        load_model("EleutherAI/pythia-160m", revision="", device="cpu")


def test_revision_reaches_from_pretrained(monkeypatch):
    """Both hub routes (the bridge's boot and the plain HF model) are given the revision; the name
    records it."""
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    hf, tok = tiny_hf_model("llama"), tiny_tokenizer()  # built before from_pretrained is replaced
    seen = []
    monkeypatch.setattr(
        models, "_check_hub_name", lambda name, revision=None: seen.append(("check", revision))
    )

    def boot(name, **kw):
        seen.append(("boot", kw.get("revision")))
        raise ValueError("Could not determine supported architecture")  # on to the plain HF model

    def model_from_pretrained(name, **kw):
        seen.append(("model", kw.get("revision")))
        return hf

    def tokenizer_from_pretrained(name, **kw):
        seen.append(("tokenizer", kw.get("revision")))
        return tok

    monkeypatch.setattr(TransformerBridge, "boot_transformers", staticmethod(boot))
    monkeypatch.setattr(
        transformers.AutoModelForCausalLM, "from_pretrained", staticmethod(model_from_pretrained)
    )
    monkeypatch.setattr(
        transformers.AutoTokenizer, "from_pretrained", staticmethod(tokenizer_from_pretrained)
    )
    model = load_model("EleutherAI/pythia-160m", revision="step1000", device="cpu")
    assert seen == [
        ("check", "step1000"),
        ("boot", "step1000"),
        ("model", "step1000"),
        ("tokenizer", "step1000"),
    ]
    assert model.cfg.model_name == "EleutherAI/pythia-160m@step1000"


def test_unknown_revision_is_named(hub):
    endpoint = hub.not_found("RevisionNotFound", "Invalid rev id: step999", timeout="2")
    with pytest.raises(
        InputError,
        match=f"the hub \\({endpoint}\\) has model 'owner/model' but no revision 'step999'",
    ):
        load_model("owner/model", revision="step999", device="cpu")


# --------------------------------------------------------------------------- checkpoints from train
def test_train_saves_a_checkpoint_at_step_zero_every_n_and_at_the_end(run):
    d, result, _ = run
    names = sorted(p.name for p in d.iterdir())
    assert names == [
        "step-000000",
        "step-000002",
        "step-000004",
    ]  # no temporary directory left behind
    info = read_info(d / "step-000002")
    assert info["step"] == 2 and info["config"] == TINY.to_dict()
    assert info["losses"] == list(result.loss_curve[:2])
    assert (
        step_of(d / "step-000002") == 2 and step_of("step1000") == 1000 and step_of("main") is None
    )


def test_checkpoints_give_the_in_memory_models_logits(run):
    d, _, model = run
    ids = _ids()
    last = load_model(d / "step-000004", device="cpu")
    torch.testing.assert_close(_logits(last, ids), _logits(model, ids), rtol=0, atol=1e-5)
    _, _, vocab, _ = token_streams(TINY.corpus, TINY.tokenizer, TINY.val_fraction)
    init = build_model(TINY, vocab).eval()  # seeded: the model at step 0
    torch.testing.assert_close(
        _logits(load_model(d / "step-000000", device="cpu"), ids),
        _logits(init, ids),
        rtol=0,
        atol=1e-5,
    )
    # the checkpoint's tokenizer gives the training ids: the corpus reads the same through it
    train_c, _ = data.load_corpus(TINY.corpus).split(TINY.val_fraction)
    train_ids, _, _, _ = token_streams(TINY.corpus, TINY.tokenizer, TINY.val_fraction)
    assert torch.equal(data.token_stream(train_c, last.tokenizer)[:2000], train_ids[:2000])


def test_checkpoints_leave_training_unchanged(run):
    _, result, _ = run
    assert train(TINY, progress=False).loss_curve == result.loss_curve


def test_checkpoints_refused_for_a_variant_an_hf_config_cannot_state(tmp_path):
    with pytest.raises(InputError, match="not plain RoPE"):
        train(
            dataclasses.replace(TINY, variant=PRoPE(0.75)),
            progress=False,
            checkpoint_dir=tmp_path,
            checkpoint_every=2,
        )
    with pytest.raises(InputError, match="together"):
        train(TINY, progress=False, checkpoint_dir=tmp_path)


# ---------------------------------------------------------------------------------------- emergence
def _synthetic(values: dict[str, list[float]], steps=(0, 100, 200, 300, 400)) -> Trajectory:
    analysis = {s.metric: s.analysis for s in STRUCTURES}
    recs = tuple(
        (s, f"ck-{s}", analysis[m], m, -1, float(v[i]))
        for m, v in values.items()
        for i, s in enumerate(steps)
    )
    return Trajectory(
        records=recs,
        checkpoints=tuple(Checkpoint(s, f"ck-{s}") for s in steps),
        analyses=ANALYSES,
        structures=STRUCTURES,
        provenance=Provenance(model="synthetic", created="2026-01-01T00:00:00"),
    )


def test_emergence_is_the_first_step_the_metric_stays_above_its_threshold(tmp_path):
    t = _synthetic(
        {
            "band_prominence": [
                1.1,
                2.5,
                1.8,
                2.2,
                3.0,
            ],  # crossed at 100, lost at 200, for good at 300
            "sink_head_share": [0.0, 0.0, 0.5, 0.6, 0.7],
            "massive_dims": [0, 0, 0, 0, 0],
            "positional_heads": [0, 1, 1, 1, 1],
        }
    )
    em = t.emergence().set_index("metric")["step"]
    assert (
        em["band_prominence"] == 300
        and em["sink_head_share"] == 200
        and em["positional_heads"] == 100
    )
    assert em.isna()["massive_dims"]
    assert (
        t.emergence({"band_prominence": 1.5}).set_index("metric")["step"]["band_prominence"] == 100
    )
    texts = [f.text for f in t.findings()]
    assert texts[0].startswith("High-norm band (band_prominence ≥ 2): appears at step 300")
    assert "has not appeared by step 400" in texts[2]
    t.save(tmp_path / "t.json")
    assert load_result(tmp_path / "t.json") == t


def test_trajectory_refuses_unordered_steps():
    with pytest.raises(InputError, match="increasing"):
        Trajectory(
            records=(),
            checkpoints=(Checkpoint(5, "a"), Checkpoint(1, "b")),
            analyses=ANALYSES,
            structures=STRUCTURES,
            provenance=Provenance(model="m"),
        )


# --------------------------------------------------------------------------------------- trajectory
def test_trajectory_has_one_model_wide_row_per_checkpoint_and_metric(traj, run):
    d, _, _ = run
    df = traj.to_frame()
    wide = df[df["layer"] == -1]
    metrics = {
        "band_peak",
        "band_width",
        "band_prominence",
        "sink_head_share",
        "sink_attention",
        "massive_dims",
        "massive_max_ratio",
        "positional_heads",
        "positional_share",
    }
    assert set(wide["metric"]) == metrics
    assert len(wide) == 3 * len(metrics) and not wide.duplicated(["step", "metric"]).any()
    assert sorted(wide["step"].unique()) == [0, 2, 4]
    assert set(df[df["layer"] >= 0]["layer"]) == {0}  # the one layer, for the per-layer metrics
    assert traj.provenance.model == str(d.resolve()) and traj.provenance.corpus == "english"
    assert traj.provenance.n_tokens == 96 and {"torch", "transformers", "ropelens"} <= set(
        traj.provenance.versions
    )
    assert list(traj.emergence()["metric"]) == [s.metric for s in STRUCTURES]
    weights = [c["weights_sha256"] for c in traj.provenance.config["checkpoints"]]
    assert len(set(weights)) == 3  # each checkpoint's own weights
    assert 0 <= traj.series("sink_head_share").max() <= 1


def test_trajectory_figure_and_page(traj, tmp_path):
    import plotly.offline

    from ropelens.plots.trajectory import trajectory_figure
    from ropelens.report.trajectory import write_trajectory

    fig = trajectory_figure(traj)
    assert len(fig.data) == len(STRUCTURES)
    assert list(fig.data[0].x) == [0, 2, 4]
    page = write_trajectory(traj, tmp_path)
    text = page.read_text()
    js = plotly.offline.get_plotlyjs()
    assert text.count(js[:80]) == 1 and "<script src=" not in text  # embedded once, nothing fetched
    assert "cdn.plot.ly" not in text.replace(js, "")
    assert "Positional heads" in text


def test_bad_checkpoints_are_one_line_errors(tmp_path, run):
    d, _, _ = run
    with pytest.raises(InputError, match="no checkpoints given"):
        trajectory([])
    with pytest.raises(InputError, match="does not exist"):
        trajectory([d / "step-000000", tmp_path / "step-000100"])
    with pytest.raises(InputError, match="revisions given with the local path"):
        trajectory(d / "step-000000", revisions=["step1000"])
    with pytest.raises(InputError, match="revisions go with one hub id"):
        trajectory(["EleutherAI/pythia-160m", "EleutherAI/pythia-70m"], revisions=["step1000"])
    with pytest.raises(InputError, match="unknown analyses"):
        trajectory(d / "step-000000", analyses=["nope"])
    plain = tiny_model_dir("llama", tmp_path / "tiny")
    with pytest.raises(InputError, match="states no training step"):
        trajectory([plain])


# ------------------------------------------------------------------------------------------ CLI
def test_cli_writes_its_three_files(run, tmp_path, capsys):
    from ropelens.cli import main

    d, _, _ = run
    out = tmp_path / "out"
    rc = main(
        [
            "trajectory",
            str(d / "step-000000"),
            str(d / "step-000004"),
            "--tokens",
            "64",
            "--analyses",
            "bands",
            "massive",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "trajectory.csv",
        "trajectory.html",
        "trajectory.json",
    ]
    printed = capsys.readouterr().out
    assert (
        "high-norm band" in printed
        and "massive values" in printed
        and "positional heads" not in printed
    )
    saved = load_result(out / "trajectory.json")
    assert saved.steps == [0, 4] and saved.analyses == ("bands", "massive")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["trajectory"], "the following arguments are required: CKPT"),
        (["trajectory", "/no/such/step-000100"], "does not exist"),
        (
            ["trajectory", "{run}/step-000000", "--revisions", "step1000"],
            "revisions given with the local path",
        ),
    ],
)
def test_cli_bad_input_is_one_line(run, tmp_path, capsys, argv, message):
    from ropelens.cli import main

    d, _, _ = run
    argv = [a.replace("{run}", str(d)) for a in argv] + ["--out", str(tmp_path / "out")]
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.startswith("ropelens: error:")]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in captured.err
    assert not (tmp_path / "out").exists()
