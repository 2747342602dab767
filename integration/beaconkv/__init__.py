"""BeaconKV: a head-granular paged KV cache with beacon-guided eviction.

Native classes (``BlockManager``, policies, ...) come from the compiled extension
``beaconkv._beaconkv`` and are resolved on first use, so the pure-Python parts
(``beaconkv.task``, ``beaconkv.reference``, ...) import without it.
"""

__version__ = "0.1.0"


def __getattr__(name):
    if name.startswith("_"):
        raise AttributeError(f"module 'beaconkv' has no attribute {name!r}")
    import importlib

    _beaconkv = importlib.import_module("beaconkv._beaconkv")
    try:
        value = getattr(_beaconkv, name)
    except AttributeError:
        raise AttributeError(f"module 'beaconkv' has no attribute {name!r}") from None
    globals()[name] = value
    return value
