# `make demo`: set up .venv and run the built-in end-to-end demo.  `make test`: the test suite.
# `make container-test`: build the image and run it as a user would (minutes; needs docker or podman).
# `make slurm-test`: the multi-node sbatch under a real two-node Slurm on this host (root; minutes).
# `make stop-stress`: start_training.sh stopped by signals at random moments, each trial rerun (minutes).
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTHON ?= python3

.PHONY: demo submission-demo test container-test slurm-test stop-stress venv hf bench clean manifest

venv: $(STAMP)

$(STAMP): requirements.txt setup.py pyproject.toml $(wildcard mlperf_bert/*/*.c)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

# the Hugging Face comparison of bench/train_throughput.py and bench/gpu_check.py, and the test of
# the Hugging Face export (tests/test_hf_export.py): the pins of requirements.txt marked
# extra == "hf", which `venv` (pip) skips
hf: $(STAMP)
	grep -E '^[^#].*; *extra *== *"hf"' requirements.txt | cut -d';' -f1 | xargs $(PY) -m pip install -q

demo: $(STAMP)
	$(PY) -m mlperf_bert demo

# ten short CPU runs (open division) -> a package -> the official checker and score
submission-demo: $(STAMP)
	$(PY) -m mlperf_bert demo --runs=10 --output_dir=demo_submission

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup --no-loadscope-reorder --durations=10 tests

# builds the image (docker or podman) and runs it as a user would; not part of `make test`
# (tests/container/check_image.py: engine and site flags from CONTAINER_* variables)
container-test: $(STAMP)
	$(PY) tests/container/check_image.py

# examples/slurm_multinode.sbatch on the demo preset under a two-node Slurm started on this host
# (tests/slurm/check_slurm.py: installs slurm-wlm and munge with apt-get when missing, needs root
# for the daemons' namespaces); not part of `make test`
slurm-test: $(STAMP)
	$(PY) tests/slurm/check_slurm.py

# the real trainer through start_training.sh (1 or 2 ranks, a run or a series), SIGTERM or SIGINT to
# its process group 1-3 times at random moments, then rerun: each status says what happened, no
# traceback, the rerun ends bit-identical (tests/stress/check_stops.py; TRIALS=N); not part of `make test`
TRIALS ?= 20
stop-stress: $(STAMP)
	$(PY) tests/stress/check_stops.py --trials=$(TRIALS)

# MANIFEST.txt: the files `package` copies as the implementation (git is not needed there, e.g. in
# the image); remake it after adding, moving or removing a tracked file (tests/test_score.py checks it).
# Written under another name, renamed when git succeeded: a failed `git ls-files` (no .git, as in the
# image) emptied the list, and package then had nothing to copy
manifest:
	git ls-files > MANIFEST.txt.tmp && mv -f MANIFEST.txt.tmp MANIFEST.txt || { rm -f MANIFEST.txt.tmp; exit 1; }

clean:
	rm -rf build *.egg-info mlperf_bert/*/*.so
