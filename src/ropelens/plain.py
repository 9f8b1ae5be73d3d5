"""Deprecated: moved to :mod:`ropelens.backends.hf`; this name stays for one release."""

import sys
import warnings

from ropelens.backends import hf as _moved

warnings.warn("ropelens.plain moved to ropelens.backends.hf; import it from there", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
