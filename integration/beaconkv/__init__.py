"""BeaconKV: a head-granular paged KV cache with beacon-guided eviction.

Native classes (``BlockManager``, policies, ...) come from the compiled extension
``beaconkv._beaconkv`` and are resolved on first use, so the pure-Python parts
(``beaconkv.task``, ``beaconkv.reference``, ...) import without it.
"""

import os as _os

__version__ = "0.1.0"

# The engine's OpenMP threads must sleep, not spin, between parallel regions: on a small,
# shared machine spinning threads starve each other (measured: 30x slower decode).
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def __getattr__(name):
    if name.startswith("_"):
        raise AttributeError(f"module 'beaconkv' has no attribute {name!r}")
    import importlib

    try:
        _beaconkv = importlib.import_module("beaconkv._beaconkv")
    except ImportError as e:
        # AttributeError, so that `from beaconkv import task` still finds the pure-Python
        # submodule when the extension is not built.
        raise AttributeError(f"module 'beaconkv' has no attribute {name!r} (the native "
                             f"extension is not available: {e})") from e
    try:
        value = getattr(_beaconkv, name)
    except AttributeError:
        raise AttributeError(f"module 'beaconkv' has no attribute {name!r}") from None
    globals()[name] = value
    return value
