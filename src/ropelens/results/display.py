"""Jupyter display: a result shows itself as its plotly figure, rendered offline (no CDN script)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["plotly_bundle"]


def plotly_bundle(fig: Any, text: str) -> dict[str, Any]:
    """A Jupyter MIME bundle for a plotly figure: rendered by Jupyter's plotly extension,
    offline."""
    return {
        "application/vnd.plotly.v1+json": {
            **json.loads(fig.to_json()),
            "config": {"displaylogo": False},
        },
        "text/plain": text,
    }
