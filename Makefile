# rmqlake — see `make help`.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
JAVA17 := $(firstword $(wildcard /usr/lib/jvm/java-17-openjdk*))
export JAVA_HOME ?= $(JAVA17)
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON := $(CURDIR)/$(BIN)/python
export PYSPARK_DRIVER_PYTHON := $(CURDIR)/$(BIN)/python
DEMO_DIR ?= demo-data
DEMO_MESSAGES ?= 50000
# Pinned jars, fetched once by Maven into a git-ignored folder: the Delta Lake
# Spark extension (jars/pom.xml) and the real RocketMQ the interop tests run
# (tests/interop/pom.xml), plus the interop harness compiled against it.
JARS := .jars
JARS_STAMP := $(JARS)/.fetched
HARNESS_STAMP := $(JARS)/interop-classes/.compiled
HARNESS_SOURCES := $(wildcard tests/interop/java/*.java)
# rmqlake's own JVM code (ingest's parser of the common line shape), compiled into one jar
JVM_SOURCES := $(wildcard jvm/src/rmqlake/jvm/*.java)
JVM_JAR := $(JARS)/rmqlake-jvm.jar
# The class-data archive a job's driver JVM starts from (spark.class_archive): made by one run of the jobs on
# generated data; remade when the virtualenv (Spark's jars) or the jars change. It needs SPARK_CONF_DIR unset.
CLASS_ARCHIVE := $(JARS)/spark-classes.jsa
MVN := mvn -q -B -Dstyle.color=never
MVN_FAILED := echo "make jars: Maven could not fetch the pinned jars (is Maven Central reachable?). They are needed once; later runs reuse $(JARS)/." >&2; exit 1

.PHONY: help venv jars demo test interop cluster-test lint bench bench-scale package lock clean airflow

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(STAMP): requirements.txt constraints.txt pyproject.toml
	@test -n "$(JAVA_HOME)" || { echo "OpenJDK 17 not found under /usr/lib/jvm; set JAVA_HOME"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.txt -c constraints.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $@

venv: $(STAMP) ## create .venv with the pinned dependencies

$(JARS_STAMP): jars/pom.xml tests/interop/pom.xml
	@command -v mvn >/dev/null || { echo "make jars: Maven (mvn) is not installed; it fetches the pinned jars once." >&2; exit 1; }
	rm -rf $(JARS)/delta $(JARS)/rocketmq
	$(MVN) -f jars/pom.xml dependency:copy-dependencies -DexcludeTransitive=true \
	  -DoutputDirectory=$(CURDIR)/$(JARS)/delta || { $(MVN_FAILED); }
	$(MVN) -f tests/interop/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
	  -DoutputDirectory=$(CURDIR)/$(JARS)/rocketmq || { $(MVN_FAILED); }
	@touch $@

$(HARNESS_STAMP): $(JARS_STAMP) $(HARNESS_SOURCES)
	rm -rf $(JARS)/interop-classes && mkdir -p $(JARS)/interop-classes
	$(if $(HARNESS_SOURCES),$(JAVA_HOME)/bin/javac -nowarn -d $(JARS)/interop-classes -cp '$(JARS)/rocketmq/*' $(HARNESS_SOURCES))
	@touch $@

# compiled against the Arrow Java jars Spark brings (pyspark/jars in the virtualenv), which it finds at run time
$(JVM_JAR): $(JVM_SOURCES) $(STAMP)
	@test -n "$(JAVA_HOME)" || { echo "OpenJDK 17 not found under /usr/lib/jvm; set JAVA_HOME"; exit 1; }
	rm -rf $(JARS)/jvm-classes && mkdir -p $(JARS)/jvm-classes
	$(JAVA_HOME)/bin/javac -nowarn --release 17 -d $(JARS)/jvm-classes \
	  -cp "$$($(BIN)/python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')/jars/*" $(JVM_SOURCES)
	$(JAVA_HOME)/bin/jar --create --file $@ -C $(JARS)/jvm-classes .

$(CLASS_ARCHIVE): $(STAMP) $(JVM_JAR)
	env -u SPARK_CONF_DIR $(BIN)/python -m rmqlake.class_archive $@ 2>$(JARS)/class-archive.log || \
	  { tail -20 $(JARS)/class-archive.log >&2; exit 1; }

jars: $(HARNESS_STAMP) $(JVM_JAR) $(CLASS_ARCHIVE) ## fetch the pinned Delta and RocketMQ jars (Maven) into .jars/, compile the interop harness and rmqlake's JVM code, make the JVM's class-data archive

demo: $(STAMP) $(JVM_JAR) $(CLASS_ARCHIVE) ## generate ~50k messages, run the jobs into ./lake, print where to look
	$(BIN)/python -m rmqlake.demo --env local --data $(DEMO_DIR) --messages $(DEMO_MESSAGES)

test: $(STAMP) $(HARNESS_STAMP) $(JVM_JAR) $(CLASS_ARCHIVE) ## run the test suite (unit, Spark, end to end, Airflow); the cluster test is separate
	$(BIN)/python -m pytest -q -m "not cluster" --durations=15

interop: $(STAMP) $(HARNESS_STAMP) ## only the tests where a real RocketMQ (store, broker, consumer) judges the lake
	$(BIN)/python -m pytest -q -m interop tests/interop

cluster-test: $(STAMP) $(HARNESS_STAMP) $(JVM_JAR) $(CLASS_ARCHIVE) ## every job on a local Spark standalone cluster (master + 2 workers) vs the local run
	$(BIN)/python -m pytest -q -m cluster tests/cluster

lint: $(STAMP) ## ruff check and format check
	$(BIN)/ruff check lib tests jobs bench airflow_dags
	$(BIN)/ruff format --check lib tests jobs bench airflow_dags

bench: $(STAMP) $(JARS_STAMP) $(JVM_JAR) $(CLASS_ARCHIVE) ## benchmarks: figures and ratios against baselines measured in the same run
	$(BIN)/python bench/ingest_bench.py
	$(BIN)/python bench/reput_bench.py
	$(BIN)/python bench/lookup_bench.py
	$(BIN)/python bench/compact_bench.py
	$(BIN)/python bench/expire_bench.py
	$(BIN)/python bench/export_bench.py
	$(BIN)/python bench/driver_memory_bench.py
	$(BIN)/python bench/engine_bench.py

# Not in `make bench`: hours of generation and jobs, and up to ~30 GB of disk at 20 M messages (each hour's input,
# the lake and the exported store are deleted as soon as they are measured).
SCALE ?= 1000000,5000000,20000000
bench-scale: $(STAMP) $(JARS_STAMP) $(JVM_JAR) $(CLASS_ARCHIVE) ## scale run: hourly batches through every step at SCALE messages (default 1M,5M,20M)
	$(BIN)/python bench/scale_bench.py --messages $(SCALE)

DIST ?= dist
# The zip holds rmqlake's modules only (pure Python, importable from a zip); its dependencies, compiled ones
# among them (msgspec, pyarrow, numpy), are the wheel's: installed on every node, or shipped as a packed env.
package: $(STAMP) ## dist/rmqlake.zip (for spark-submit --py-files) and the wheel (its dependencies: for the nodes)
	rm -rf $(DIST) build && mkdir -p $(DIST)
	$(BIN)/python -c "import pathlib, sys, zipfile; z = zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_DEFLATED); \
	  [z.write(p, p.relative_to('lib')) for p in sorted(pathlib.Path('lib/rmqlake').rglob('*.py'))]; z.close()" \
	  $(DIST)/rmqlake.zip
	$(BIN)/pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation -w $(DIST) .
	rm -rf build
	@ls -l $(DIST)

AIRFLOW_HOME_DIR := $(CURDIR)/.airflow-home
airflow: $(STAMP) ## a local Airflow (standalone, sqlite in .airflow-home) with the rmqlake DAGs; UI on :8080
	mkdir -p $(AIRFLOW_HOME_DIR)
	export AIRFLOW_HOME=$(AIRFLOW_HOME_DIR) AIRFLOW__CORE__DAGS_FOLDER=$(CURDIR)/airflow_dags \
	  AIRFLOW__CORE__LOAD_EXAMPLES=False RMQLAKE_HOME=$(CURDIR) RMQLAKE_RUNNER=$${RMQLAKE_RUNNER:-local} \
	  RMQLAKE_ENV=$${RMQLAKE_ENV:-local} RMQLAKE_LAKE=$${RMQLAKE_LAKE:-$(CURDIR)/lake} RMQLAKE_CONF=$(CURDIR)/conf \
	  PATH=$(CURDIR)/$(BIN):$$PATH; \
	$(BIN)/airflow db migrate && \
	$(BIN)/airflow pools set rmqlake_lake 1 "one job writes a lake at a time" && \
	$(BIN)/airflow standalone

lock: ## re-freeze constraints.txt from a fresh install of requirements.txt
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install --quiet -r requirements.txt
	.venv-lock/bin/pip freeze --exclude-editable | sort > constraints.txt
	rm -rf .venv-lock

clean: ## remove the virtualenv, demo data, lake and build outputs
	rm -rf $(VENV) $(JARS) $(DEMO_DIR) lake dist build lib/*.egg-info .pytest_cache .airflow-test .airflow-home
