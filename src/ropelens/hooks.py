"""Deprecated: moved to :mod:`ropelens.backends.bridge_hooks`; this name stays for one release."""

import sys
import warnings

from ropelens.backends import bridge_hooks as _moved

warnings.warn("ropelens.hooks moved to ropelens.backends.bridge_hooks; import it from there", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
