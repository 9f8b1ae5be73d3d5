"""Deprecated: moved to :mod:`ropelens.backends.engine`; this name stays for one release."""

import sys
import warnings

from ropelens.backends import engine as _moved

warnings.warn("ropelens.engine moved to ropelens.backends.engine; import it from there", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
