"""Builds the optional C accelerator of the data generator; everything works without it, slower."""
import glob

from setuptools import Extension, setup

ext = [Extension("mlperf_bert." + p.split("/")[-1][:-2], [p], optional=True, extra_compile_args=["-O3"])
       for p in sorted(glob.glob("mlperf_bert/*.c"))]
setup(ext_modules=ext)
