"""The wheel carries libshmsteer.so, native code for one platform: tag it for this platform
(any Python 3, no Python ABI: the library is loaded with ctypes). It also carries the key get
extension _fastkeys.abi3.so and the resolve extension _faststep.abi3.so when `go generate
./capi` built them (CPython >= 3.10's stable ABI); the tag stays py3-none, since an interpreter
that cannot load them reads keys and resolves steps through ctypes instead (shmsteer.keys,
shmsteer.device). Everything else is in
pyproject.toml. Builds with Debian's python3-setuptools and python3-wheel, no package index:

    python3 -m pip wheel --no-index --no-build-isolation --no-deps -w dist ./python
"""

from setuptools import Distribution, setup

try:  # setuptools >= 70.1 has its own
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # older setuptools (Debian 12's 66): the wheel package's
    from wheel.bdist_wheel import bdist_wheel


class NativeDistribution(Distribution):
    """The package holds native code, so it installs into platlib, at the wheel's root."""

    def has_ext_modules(self) -> bool:
        return True


class PlatformWheel(bdist_wheel):
    """bdist_wheel tagged py3-none-<platform>."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(distclass=NativeDistribution, cmdclass={"bdist_wheel": PlatformWheel})
