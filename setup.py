"""Builds the optional C accelerator of the data generator; everything works without it, slower."""
import glob

from setuptools import Extension, setup

ext = [Extension(p[:-2].replace("/", "."), [p], optional=True, extra_compile_args=["-O3"])
       for p in sorted(glob.glob("mlperf_bert/**/*.c", recursive=True))]
setup(ext_modules=ext)
