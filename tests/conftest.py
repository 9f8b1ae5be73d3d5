"""Shared fixtures: tiny random models and the family matrix's tiny models (unit tests), the real
embedded models (integration)."""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path

# Set before transformers or huggingface_hub is imported (they read it once): no test may reach the
# hub, and an unknown name must fail fast instead of retrying a network that is not there.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

import ropelens
from ropelens.spec.reading import rope_spec
from ropelens.testing import tiny_model, tiny_model_dir
from ropelens.testing.families import family_model_dir

ROPE_FAMILIES = ("llama", "llama-gqa", "gemma3", "gptj")


@pytest.fixture(scope="session")
def tiny():
    """``tiny(family)``: a tiny random bridge model, built once per family per session."""
    return functools.cache(tiny_model)


@pytest.fixture(scope="session", params=ROPE_FAMILIES)
def rope_family(request) -> str:
    """Each tiny RoPE family in turn."""
    return request.param


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """``tiny_dir(family)``: a tiny model saved as an HF directory, once per family per session."""

    @functools.cache
    def make(family: str):
        return tiny_model_dir(family, tmp_path_factory.mktemp(f"tiny-{family}"))

    return make


@pytest.fixture(scope="session")
def family_dir(tmp_path_factory):
    """``family_dir(name)``: the family's tiny model (:mod:`ropelens.testing.families`) saved as an
    HF directory, once per family per session. Tests only read it: one that edits a model saves its
    own."""

    @functools.cache
    def make(name: str) -> Path:
        return family_model_dir(name, tmp_path_factory.mktemp(name) / name)

    return make


@pytest.fixture(scope="module")
def family_model(family_dir):
    """``family_model(name)``: (model, spec) of the family's tiny model, loaded with
    ``load_model(path)`` from :func:`family_dir`, once per family per module."""

    @functools.cache
    def load(name: str):
        model = ropelens.load_model(family_dir(name), device="cpu")
        return model, rope_spec(model)

    return load


@pytest.fixture
def tiny_embedded(tiny_dir, monkeypatch):
    """The name of a stand-in embedded model whose converted weights are the tiny Llama's
    directory."""
    from ropelens.loading import models

    entry = models.EmbeddedModel(
        name="tiny-embedded",
        hub_name="ropelens/tiny-llama",
        distribution="torch",
        install="(installed)",
        gguf=lambda _scratch: Path("unused.gguf"),
        description="the tiny Llama, loaded by name",
    )
    monkeypatch.setitem(models.EMBEDDED_MODELS, entry.name, entry)
    # load_model's embedded branch reads the converted directory from the cache; point it at the
    # tiny model
    monkeypatch.setattr(models, "_cached_hf_dir", lambda _key, _gguf, _source: tiny_dir("llama"))
    return entry.name


@pytest.fixture(scope="session")
def smollm2():
    """The embedded SmolLM2-135M, loaded once (converts the GGUF on the first run on a machine)."""
    return ropelens.load_model("smollm2-135m", device="cpu")


@pytest.fixture(scope="session")
def gemma3():
    """The embedded Gemma-3-270M, loaded once (converts the GGUF on the first run on a machine)."""
    return ropelens.load_model("gemma-3-270m", device="cpu")


@pytest.fixture(scope="session")
def experiment():
    """``experiment(name)``: the script ``experiments/<name>.py`` imported as a module."""
    folder = Path(__file__).resolve().parents[1] / "experiments"
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))  # the scripts import their shared _common module

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load


class Registry:
    """The analysis registry during one test: what a test registers, replaces or drops is undone
    after it."""

    def __init__(self, monkeypatch):
        from ropelens.analyses import registry
        from ropelens.results import figures

        monkeypatch.setattr(registry, "ANALYSES", dict(registry.ANALYSES))
        monkeypatch.setattr(figures, "_FIGURES", dict(figures._FIGURES))
        self.module = registry

    def replace_section(self, key: str, **changes) -> None:
        """The section ``key`` with ``changes`` (e.g. ``render=boom``), in its place."""
        import dataclasses

        owner = next(
            a for a in self.module.analyses() if a.section is not None and a.section.key == key
        )
        self.module.ANALYSES[owner.name] = dataclasses.replace(
            owner, section=dataclasses.replace(owner.section, **changes)
        )

    def keep_sections(self, keep) -> None:
        """Only the sections for which ``keep(section)`` is true (the analyses keep their
        commands)."""
        import dataclasses

        for a in self.module.analyses():
            if a.section is not None and not keep(a.section):
                self.module.ANALYSES[a.name] = dataclasses.replace(a, section=None)


@pytest.fixture
def registry(monkeypatch) -> Registry:
    """The analysis registry, restored after the test."""
    return Registry(monkeypatch)


class Hub:
    """A local stand-in for the model hub, for tests of what ropelens says when the hub answers (or
    does not)."""

    def __init__(self, monkeypatch):
        from huggingface_hub import constants

        self._monkeypatch, self._constants, self._servers = monkeypatch, constants, []
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def point(self, endpoint: str, timeout: str = "0.5") -> str:
        """Send the hub client to ``endpoint`` with a short timeout; returns the endpoint."""
        self._monkeypatch.setattr(self._constants, "ENDPOINT", endpoint)
        self._monkeypatch.setenv("ROPELENS_HUB_TIMEOUT", timeout)
        return endpoint

    def not_found(self, code: str, error: str, timeout: str = "0.5") -> str:
        """Serve 404 with the hub's error code ``code`` (``RepoNotFound``, ``RevisionNotFound``) to
        every request, and point the client there; returns the endpoint."""
        import http.server
        import json
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps({"error": error}).encode()
                self.send_response(404)
                self.send_header("X-Error-Code", code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # quiet
                pass

        server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._servers.append(server)
        return self.point(f"http://127.0.0.1:{server.server_port}", timeout)

    def close(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()


@pytest.fixture
def hub(monkeypatch):
    """A local model hub (:class:`Hub`), its servers shut down after the test."""
    h = Hub(monkeypatch)
    yield h
    h.close()
