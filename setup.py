from setuptools import Extension, setup

setup(
    cffi_modules=["k7core/_native/_build.py:ffibuilder"],
    ext_modules=[
        Extension(
            "k7core._native._fast",
            sources=["k7core/_native/_fast.c", "k7core/_native/k7.c"],
            include_dirs=["k7core/_native"],
            libraries=["pthread"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-fno-strict-aliasing"],
        )
    ],
)
