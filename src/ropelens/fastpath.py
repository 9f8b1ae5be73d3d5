"""Deprecated: moved to :mod:`ropelens.backends.fastpath`; this name stays for one release."""

import sys
import warnings

from ropelens.backends import fastpath as _moved

warnings.warn("ropelens.fastpath moved to ropelens.backends.fastpath; import it from there", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
