"""Builds rec's custom torch ops (cpp/ops) into the `rec` package as rec/_ops*.so.

Everything else about the package is in pyproject.toml. The library links LibTorch only (no
libtorch_python, `py_limited_api`), so rec-server and Triton's Python backend load the same file
as Python does (rec.ops.LIBRARY).
"""

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    ext_modules=[
        CppExtension(
            "rec._ops",
            [
                "cpp/ops/linear.cpp",
                "cpp/ops/linear_int8.cpp",
                "cpp/ops/zch.cpp",
                "cpp/ops/feature_major.cpp",
            ],
            # OpenMP for at::parallel_for (its pragma is compiled here); at run time the
            # libgomp.so.1 torch already loaded serves it, one thread pool for both.
            extra_compile_args=["-O3", "-ffp-contract=off", "-fopenmp"],
            extra_link_args=["-fopenmp"],
            py_limited_api=True,
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(no_python_abi_suffix=True)},
)
