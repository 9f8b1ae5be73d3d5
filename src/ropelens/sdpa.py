"""Deprecated: moved to :mod:`ropelens.backends.sdpa`; this name stays for one release."""

import sys
import warnings

from ropelens.backends import sdpa as _moved

warnings.warn("ropelens.sdpa moved to ropelens.backends.sdpa; import it from there", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
