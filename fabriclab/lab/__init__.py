"""The running lab: Lab, the Mininet adapter, the controller process, the run record, clean."""

import sys


def _distutils_from_the_stdlib():
    """Mininet's node module imports distutils.version. In a venv, setuptools' shim
    (distutils-precedence.pth) answers `import distutils` by importing all of setuptools: 0.25 s of
    every process that builds a lab on this machine, and seconds in the full-kernel tier's emulated
    guest. Python 3.11's own distutils is enough; where the stdlib has none (3.12 on), the shim stays."""
    import importlib.util

    hack = sys.modules.get("_distutils_hack")
    if hack is None or "distutils" in sys.modules or not hasattr(hack, "remove_shim"):
        return
    hack.remove_shim()
    if importlib.util.find_spec("distutils") is None:
        hack.add_shim()


_distutils_from_the_stdlib()
