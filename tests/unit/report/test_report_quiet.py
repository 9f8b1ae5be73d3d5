"""``ropelens report --quiet`` draws no progress bar: not the report's, not any analysis's it runs
(the head taxonomy's two passes drew theirs)."""

from __future__ import annotations

from ropelens.cli import main


def test_quiet_report_draws_no_progress_bar(tiny_dir, tmp_path, capfd):
    out = tmp_path / "report"
    model_dir = tiny_dir("llama")
    capfd.readouterr()  # writing the tiny model's files draws its own bar, before the command
    argv = ["report", str(model_dir), "--tokens", "256", "--n-ctx", "64", "--no-verify"]
    assert main([*argv, "--out", str(out), "--quiet"]) == 0
    captured = capfd.readouterr()
    assert (out / "index.html").exists()
    assert captured.err == ""  # a tqdm bar writes its "NN%|███|" lines to stderr
    assert "%|" not in captured.out
