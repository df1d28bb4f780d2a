from setuptools import Extension, setup

setup(
    # The kernel (k7.c, k7_bus.c) is compiled once, into the cffi module k7core._native._k7;
    # _fast calls it through the k7_api table that k7core._kernel binds at import.
    cffi_modules=["k7core/_native/_build.py:ffibuilder"],
    ext_modules=[
        Extension(
            "k7core._native._fast",
            sources=["k7core/_native/_fast.c"],
            depends=["k7core/_native/k7.h"],
            include_dirs=["k7core/_native"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-fno-strict-aliasing"],
        )
    ],
)
