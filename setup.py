from setuptools import setup

setup(cffi_modules=["k7core/_native/_build.py:ffibuilder"])
