# Parallax build. `make` builds the library and the `parallax` command; `make check` builds and
# runs every test (unit tests plain and under ASan+UBSan, integration scripts, cppcheck);
# `make check-long` what is too long for it (the crash harness's second seeds and its sanitized
# run, the smoke runs of the benchmarks, the long parts of some integration scripts); `make bench`
# runs the full suite.

CC      ?= cc
CFLAGS  ?= -O2 -g
WARN    := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes \
           -Wmissing-prototypes -Wno-unused-parameter
# The library is built from wings, one folder of libparallax/ per part of the engine (docs/DESIGN.md
# "Layers"); each folder is on the include path, so a file names a header by its bare name.
LIB_WINGS := $(sort $(patsubst %/,%,$(dir $(wildcard libparallax/*/*.[ch]))))
INC     := $(addprefix -I,$(LIB_WINGS))
# The lock wing's client of the lock manager and lockd/ share lockd's protocol header
# (lockd/lockd_proto.h): a definition both sides speak, not lockd's code. Only the lock wing's
# objects see lockd/ (and cppcheck, which reads them).
LOCKD_INC := -Ilockd
# Headers of the programs around the library (tools, NBD server, host/: what every host of the
# engine builds in, tapdisk driver, tests); the library's own objects do not get them, so it
# cannot include what sits above it.
APP_INC := -Itools -Iserver -Ihost -Itapdisk -Itests/unit
LIBS    := -laio -liscsi
B       := build
# Every object writes its header dependencies beside it (build/**/*.d, included at the end).
DEPFLAGS := -MMD -MP

# The version, read from parallax.h (PLX_API_VERSION_MAJOR/MINOR/PATCH) so it is written once.
plx_version_part = $(shell sed -n 's/^\#define PLX_API_VERSION_$(1) *\([0-9]*\).*/\1/p' \
                           libparallax/include/parallax.h)
PLX_MAJOR   := $(call plx_version_part,MAJOR)
PLX_VERSION := $(PLX_MAJOR).$(call plx_version_part,MINOR).$(call plx_version_part,PATCH)
SONAME      := libparallax.so.$(PLX_MAJOR)
LIB_MAP     := libparallax/libparallax.map

LIB_SRCS  := $(wildcard libparallax/*/*.c)
TEST_LIB_SRCS := tests/unit/backend_fault.c tests/unit/testutil.c tests/unit/tgtd.c \
                 tests/unit/check_msgfile.c
TOOL_SRCS := $(wildcard tools/*.c server/*.c host/*.c)
UNIT_SRCS := $(wildcard tests/unit/test_*.c)

# Object of each source: build/obj/PATH.o, and build/san/PATH.o for the ASan+UBSan build.
obj = $(patsubst %.c,$(B)/obj/%.o,$(1))
san = $(patsubst %.c,$(B)/san/%.o,$(1))
LIB_OBJS := $(call obj,$(LIB_SRCS))

all: $(B)/libparallax.a $(B)/libparallax.so $(B)/parallax $(B)/parallax-lockd

# ---- objects -----------------------------------------------------------------------------------
# -fvisibility=hidden: the shared library exports only what parallax.h declares (under its
# visibility pragma) and libparallax.map lists. The static archive keeps every symbol, so the
# programs and tests that use internals (backend.h, format.h) link it instead.
SAN := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
OBJ_FLAGS := $(WARN) $(CPPFLAGS) $(CFLAGS) -fPIC -fvisibility=hidden $(DEPFLAGS)
# The sanitized build is only for the unit tests: it has the test hooks (test_hooks.h).
SAN_FLAGS := $(WARN) -O1 -g $(SAN) -DPLX_TEST_HOOKS $(DEPFLAGS)

# Objects depend on the flags they were built with: this file changes only when they do.
$(B)/compile-flags: FORCE | $(B)
	@echo '$(CC) $(OBJ_FLAGS) | $(SAN_FLAGS) | $(INC) $(APP_INC)' | cmp -s - $@ || \
	    echo '$(CC) $(OBJ_FLAGS) | $(SAN_FLAGS) | $(INC) $(APP_INC)' > $@

$(B)/obj/libparallax/%.o: libparallax/%.c $(B)/compile-flags | builddeps
	@mkdir -p $(dir $@)
	$(CC) $(OBJ_FLAGS) $(INC) -c $< -o $@

$(B)/obj/%.o: %.c $(B)/compile-flags | builddeps
	@mkdir -p $(dir $@)
	$(CC) $(OBJ_FLAGS) $(INC) $(APP_INC) -c $< -o $@

$(B)/obj/libparallax/lock/%.o $(B)/san/libparallax/lock/%.o $(B)/test/obj/libparallax/lock/%.o: \
    INC += $(LOCKD_INC)

# The test build of a file that reads a test hook (base/test_hooks.h): -DPLX_TEST_HOOKS.
$(B)/test/obj/libparallax/%.o: libparallax/%.c $(B)/compile-flags | builddeps
	@mkdir -p $(dir $@)
	$(CC) $(OBJ_FLAGS) -DPLX_TEST_HOOKS $(INC) -c $< -o $@

$(B)/san/libparallax/%.o: libparallax/%.c $(B)/compile-flags | builddeps
	@mkdir -p $(dir $@)
	$(CC) $(SAN_FLAGS) $(INC) -c $< -o $@

$(B)/san/%.o: %.c $(B)/compile-flags | builddeps
	@mkdir -p $(dir $@)
	$(CC) $(SAN_FLAGS) $(INC) $(APP_INC) -c $< -o $@

FORCE:

# ---- the library -------------------------------------------------------------------------------
$(B)/libparallax.a: $(LIB_OBJS)
	rm -f $@ && ar rcs $@ $^

# The test build of the library (base/test_hooks.h): the files that read a test hook are built
# with them, every other object is the release one. The unit tests and build/test/parallax link it;
# the library others link (above, and libparallax.so) has no test hook.
HOOK_SRCS := $(shell grep -lw plx_test_hook $(LIB_SRCS))
TEST_LIB_OBJS := $(filter-out $(call obj,$(HOOK_SRCS)),$(LIB_OBJS)) \
                 $(patsubst %.c,$(B)/test/obj/%.o,$(HOOK_SRCS))
$(B)/test/libparallax.a: $(TEST_LIB_OBJS)
	rm -f $@ && ar rcs $@ $^

# The same objects built with the sanitizers, for the sanitized unit tests.
$(B)/san/libparallax.a: $(call san,$(LIB_SRCS))
	rm -f $@ && ar rcs $@ $^

# libparallax.so.X.Y.Z (soname libparallax.so.X) and its two links, as installed.
$(B)/libparallax.so.$(PLX_VERSION): $(LIB_OBJS) $(LIB_MAP)
	$(CC) $(CFLAGS) $(LDFLAGS) -shared -Wl,-soname,$(SONAME) -Wl,--version-script=$(LIB_MAP) \
	    -Wl,--no-undefined -o $@ $(LIB_OBJS) $(LIBS)

$(B)/$(SONAME): $(B)/libparallax.so.$(PLX_VERSION)
	ln -sf $(notdir $<) $@

$(B)/libparallax.so: $(B)/$(SONAME)
	ln -sf $(notdir $<) $@

# ---- programs (they link the static archive) ---------------------------------------------------
# -ldl: GnuTLS is dlopen'ed by a server started with TLS (server/nbd_tls.c). -lblkid: format's
# look for what a target already holds (tools/signature.c); only the command links it.
$(B)/parallax: $(call obj,$(TOOL_SRCS)) $(B)/libparallax.a
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LIBS) -lblkid -ldl -lpthread -o $@

# The command built with the test hooks, for the integration scripts that need one
# (tests/integration/fence_rejoin.sh). Never installed.
$(B)/test/parallax: $(call obj,$(TOOL_SRCS)) $(B)/test/libparallax.a
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LIBS) -lblkid -ldl -lpthread -o $@

# The lock manager of many hosts (lockd/). It shares only the protocol header with the library;
# with --store it arbitrates with its standbys on the LUN through libiscsi (lockd/arbiter.c).
$(B)/parallax-lockd: $(call obj,lockd/lockd.c lockd/arbiter.c)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ -liscsi -lpthread -o $@

$(B):
	@mkdir -p $(B)

# ---- unit tests (Check), plain and sanitized -------------------------------------------------
# Each test binary is its own object, the test helpers and the library archive (the test build,
# with the test hooks): the library is compiled once per flavour, not once per test.
CHECK_LIBS = $(shell pkg-config --libs check 2>/dev/null || echo -lcheck -lsubunit -lm -lrt -lpthread)

# Check's runner creates the file each test reports through with mkstemp(); the unit tests take
# that call (tests/unit/check_msgfile.c) to give the file its room before the test writes to it.
CHECK_WRAP := -Wl,--wrap=mkstemp

# Extra sources of a unit test besides the library: EXTRA_<test>. A family of test binaries of one
# part (test_tapdisk*, test_backend*, test_gc*, test_wlog*, test_engine*) shares its fixture and
# helpers through tests/unit/<part>_fixture.c.
EXTRA_test_tapdisk := tests/unit/tapdisk_fixture.c tests/unit/tapdisk_driver.c \
                      tests/unit/tapdisk_double.c host/control_server.c host/control_client.c \
                      host/handover.c
EXTRA_test_tapdisk_host := $(EXTRA_test_tapdisk)
EXTRA_test_tapdisk_durability := $(EXTRA_test_tapdisk)
EXTRA_test_backend := tests/unit/backend_fixture.c
EXTRA_test_backend_file := tests/unit/backend_fixture.c
EXTRA_test_backend_fault := tests/unit/backend_fixture.c
EXTRA_test_gc := tests/unit/gc_fixture.c
EXTRA_test_gc_crash := tests/unit/gc_fixture.c
EXTRA_test_gc_races := tests/unit/gc_fixture.c
EXTRA_test_wlog := tests/unit/wlog_fixture.c
EXTRA_test_wlog_auto := tests/unit/wlog_fixture.c
EXTRA_test_wlog_drain := tests/unit/wlog_fixture.c
EXTRA_test_engine := tests/unit/engine_fixture.c
EXTRA_test_engine_io := tests/unit/engine_fixture.c
EXTRA_test_engine_async := tests/unit/engine_fixture.c
# The crash harness's rooms (tests/unit/test_crash.c lists them).
EXTRA_test_crash := tests/unit/crash_model.c tests/unit/crash_backend.c \
                    tests/unit/crash_requests.c tests/unit/crash_verify.c \
                    tests/unit/crash_workloads.c tests/unit/crash_eio.c tests/unit/crash_registry.c

.SECONDEXPANSION:
$(B)/unit/%: $(B)/obj/tests/unit/%.o $$(call obj,$$(EXTRA_$$*)) $(call obj,$(TEST_LIB_SRCS)) \
             $(B)/test/libparallax.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $(CHECK_WRAP) $^ $(LIBS) $(CHECK_LIBS) -o $@

$(B)/unit-san/%: $(B)/san/tests/unit/%.o $$(call san,$$(EXTRA_$$*)) $(call san,$(TEST_LIB_SRCS)) \
                 $(B)/san/libparallax.a
	@mkdir -p $(dir $@)
	$(CC) -O1 -g $(SAN) $(CHECK_WRAP) $^ $(LIBS) $(CHECK_LIBS) -o $@

# These run the real lock manager built beside them (order-only: not linked in).
$(B)/unit/test_lockwait $(B)/unit-san/test_lockwait $(B)/unit/test_lockd \
    $(B)/unit-san/test_lockd $(B)/unit/test_tapdisk_host \
    $(B)/unit-san/test_tapdisk_host: | $(B)/parallax-lockd

# Objects are kept (make would delete them as intermediates of the binaries above).
.SECONDARY:

UNIT_BINS     := $(UNIT_SRCS:tests/unit/%.c=$(B)/unit/%)
UNIT_SAN_BINS := $(UNIT_SRCS:tests/unit/%.c=$(B)/unit-san/%)

unit: $(UNIT_BINS)
	@tests/run-unit.sh $(UNIT_BINS)

unit-san: $(UNIT_SAN_BINS)
	@tests/run-unit.sh $(UNIT_SAN_BINS)

# Both builds in one run, one binary per CPU at a time, the longest first so that no long one
# runs alone at the end: the crash harness (the first run of each workload, in three shards),
# then the next longest, then the rest. The crash harness's further runs (another seed of each
# workload) and its sanitized run (PLX_TEST_QUICK, 40 CPU seconds, the longest sanitized binary)
# are in check-long.
CRASH := $(B)/unit/test_crash
CRASH_SAN := $(B)/unit-san/test_crash
UNIT_LONG := $(B)/unit-san/test_scale $(B)/unit-san/test_registry $(B)/unit/test_model
unit-all: $(UNIT_BINS) $(UNIT_SAN_BINS)
	@tests/run-unit.sh "env PLX_CRASH_RUNS=first PLX_CRASH_SHARD=0/3 $(CRASH)" \
	    "env PLX_CRASH_RUNS=first PLX_CRASH_SHARD=1/3 $(CRASH)" \
	    "env PLX_CRASH_RUNS=first PLX_CRASH_SHARD=2/3 $(CRASH)" $(UNIT_LONG) \
	    $(filter-out $(CRASH) $(CRASH_SAN) $(UNIT_LONG),$(UNIT_BINS) $(UNIT_SAN_BINS))

# What is too long for make check (CI runs both, README "Tests"): the crash harness's runs after
# the first of each workload (another seed, in two shards) and its sanitized run, beside the smoke
# runs of the benchmarks (the smokes judge no times); then the integration scripts' long parts
# (tests/run-integration.sh --long: the scripts whose header says `plx-test: long-parts`).
check-long: deps
	@$(MAKE) --no-print-directory -j$(NPROC) $(CRASH) $(CRASH_SAN) all $(B)/test/parallax \
	    $(B)/tapdisk-standin $(B)/make-v1 $(B)/bench-engine $(B)/bench-handover \
	    $(B)/bench-lun-writers
	@$(BESIDE_MAKE) crash-long & crash=$$!; \
	    $(BESIDE_MAKE) bench-smokes; smokes=$$?; \
	    wait $$crash && [ $$smokes -eq 0 ]
	@tests/run-integration.sh --long
	@echo "make check-long: all passed"

crash-long: $(CRASH) $(CRASH_SAN)
	@PLX_TEST_JOBS=1 tests/run-unit.sh "env PLX_CRASH_RUNS=rest PLX_CRASH_SHARD=0/2 $(CRASH)" \
	    "env PLX_CRASH_RUNS=rest PLX_CRASH_SHARD=1/2 $(CRASH)" $(CRASH_SAN)

# A tapdisk stand-in for the integration tests of block-parallax-tap: the real driver on the
# tapdisk test double's loop, requests from stdin (tests/integration/tapdisk_standin.c).
TAPDISK_STANDIN_SRCS := tests/integration/tapdisk_standin.c tests/unit/tapdisk_driver.c \
                        tests/unit/tapdisk_double.c host/control_server.c host/control_client.c \
                        host/handover.c
$(B)/tapdisk-standin: $(call obj,$(TAPDISK_STANDIN_SRCS)) $(B)/libparallax.a
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LIBS) -o $@

# Rewrites a store as format version 1, for the upgrade's integration test
# (tests/integration/make_v1.c; the unit tests' tu_make_v1 on a file).
MAKE_V1_SRCS := tests/integration/make_v1.c tests/unit/testutil.c tests/unit/backend_fault.c \
                tests/unit/tgtd.c
$(B)/make-v1: $(call obj,$(MAKE_V1_SRCS)) $(B)/libparallax.a
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LIBS) $(CHECK_LIBS) -o $@

integration: all deps $(B)/test/parallax $(B)/tapdisk-standin $(B)/make-v1
	@tests/run-integration.sh

# The layer rule of docs/DESIGN.md ("Layers: which file holds what"): every file of the library
# has a row, every reference between its objects (nm) goes to its own row or a lower one, every
# header includes headers of its row or lower; the NBD server's files go down their own order
# ("The NBD server's files"); no files call each other in a circle (tests/layers.sh; well under
# a second).
layers: $(LIB_OBJS) $(call obj,$(wildcard server/*.c))
	@tests/layers.sh $(B)/obj

lint: builddeps
	cppcheck --quiet --error-exitcode=1 --enable=warning,performance,portability \
	    --inline-suppr --suppress=missingIncludeSystem $(INC) $(LOCKD_INC) \
	    libparallax tools server host tapdisk lockd

format: builddeps
	clang-format -i $(wildcard libparallax/*/*.[ch] tools/*.[ch] tests/unit/*.[ch])

# make check in three phases, each keeping every CPU busy (one target after the other, the build
# ran on one CPU):
# 1. everything the tests run is built at once, cppcheck beside the compiler, the layer rule
#    (make layers) once the library's objects are;
# 2. the unit tests, plain and sanitized (unit-all);
# 3. the integration scripts, the alone ones first, then the others.
# Each phase ends with its line "make check: PHASE N s" (wall seconds), and the last line sums
# them up: where a run's time went.
# Beside them from the start, the Debian packages the lab tests are made of (lab-packages) are
# fetched in the background: the download waits on the network while the build and the unit
# tests keep the CPUs busy, instead of holding up vm_clones and xen_real on a clean clone. Those
# scripts take the package cache's lock (scripts/deb-cache.sh): one that starts before the fetch
# has ended waits for it, and after a failed fetch (its line says so) downloads what is missing
# itself, as it would alone. If make check stops early, the fetch is stopped too.
# The smoke runs of the benchmarks (some 9 minutes beside the integration scripts at a load of
# 12-19), the crash harness's second seeds and sanitized run, and the long parts of some
# integration scripts are in check-long.
NPROC := $(shell nproc 2>/dev/null || echo 1)
CHECK_BUILD := all $(UNIT_BINS) $(UNIT_SAN_BINS) $(B)/test/parallax $(B)/tapdisk-standin $(B)/make-v1
# (check and check-long name their makes through BESIDE_MAKE: a line naming $(MAKE) itself would
# run even under make -n.) The fetch runs in a session of its own (setsid: its process group's
# id is its pid) so that it can be stopped whole, with the apt-get it started (dash's kill takes
# no `--`).
BESIDE_MAKE = $(MAKE) --no-print-directory
check: deps
	@t0=$$(date +%s); \
	setsid $(BESIDE_MAKE) lab-packages & fetch=$$!; \
	trap 'kill -TERM -'$$fetch' 2>/dev/null' EXIT; trap 'exit 130' INT TERM; \
	$(BESIDE_MAKE) -j$(NPROC) $(CHECK_BUILD) lint layers || exit 1; \
	t1=$$(date +%s); echo "make check: build $$((t1 - t0)) s"; \
	$(BESIDE_MAKE) unit-all || { echo "make check: unit failed after $$(($$(date +%s) - t1)) s"; exit 1; }; \
	t2=$$(date +%s); echo "make check: unit $$((t2 - t1)) s"; \
	tests/run-integration.sh || { echo "make check: integration failed after $$(($$(date +%s) - t2)) s"; exit 1; }; \
	t3=$$(date +%s); echo "make check: integration $$((t3 - t2)) s"; \
	wait $$fetch; trap - EXIT; \
	echo "make check: all passed in $$((t3 - t0)) s (build $$((t1 - t0)) s, unit $$((t2 - t1)) s, integration $$((t3 - t2)) s)"

# The Debian packages of the lab tests (the golden image of vm_clones, the Xen lab of xen_real)
# fetched into build/cache/debs, nothing built; one line says how it went (log:
# build/test-logs/lab-packages.log). make check runs it in the background.
lab-packages:
	@mkdir -p $(B)/test-logs; t0=$$(date +%s); \
	if { scripts/golden-image.sh --fetch; g=$$?; scripts/xen-lab.sh fetch && [ $$g -eq 0 ]; } \
	    >$(B)/test-logs/lab-packages.log 2>&1; then \
	    echo "make check: lab packages ready in build/cache/debs ($$(($$(date +%s) - t0)) s)"; \
	else \
	    echo "make check: fetching the lab packages FAILED (log: $(B)/test-logs/lab-packages.log):" \
	        "vm_clones and xen_real will try again themselves"; \
	    tail -5 $(B)/test-logs/lab-packages.log; exit 1; \
	fi

# The smoke runs of the benchmarks, one after the other (make check-long runs them beside the
# crash harness's long runs).
bench-smokes: bench-smoke bench-suite-smoke bench-clones-smoke bench-cluster-smoke bench-soak-smoke

# The Xen lab (docs/xen-lab.md): Debian's Xen 4.17 and kernel booted under QEMU TCG, this tree
# installed in dom0. `make xen-lab` gives a dom0 shell; `make check-xen` runs every case in
# tests/xen/cases (the short one also runs in make check, as tests/integration/xen_real.sh).
# The cases that live-migrate a guest (their files say "# xen-lab: shadow") boot in a second
# lab whose Xen has shadow paging (docs/xen-lab.md), on a blockstore of its own; storagevm needs
# that too: it makes its VDIs under the names web3-pv-dd.cfg gives them, and the clone case has
# already made a 'gold' on the first one. (Their boot's time limit: at a load average of 10 the
# two took 3.5 and more than 10 minutes.)
XEN_CASES := short clone attach saverestore destroy
XEN_SHADOW_CASES := migrate storagevm
xendeps: builddeps
	@$(DEPS_SCRIPT) xen

xen-lab: xendeps all
	@scripts/xen-lab.sh shell

check-xen: xendeps all
	@scripts/xen-lab.sh run $(XEN_CASES)
	@scripts/xen-lab.sh --timeout 1500 run $(XEN_SHADOW_CASES)

# The step that installs missing Debian packages; a package build sets DEPS_SCRIPT=true, since
# dpkg-buildpackage has already checked Build-Depends.
DEPS_SCRIPT ?= scripts/install-deps.sh

builddeps:
	@$(DEPS_SCRIPT) build

deps: builddeps
	@$(DEPS_SCRIPT) test

demo: builddeps all
	@scripts/demo.sh

# ---- engine benchmark (bench/README.md) ----------------------------------------------------------
BENCH_DIR ?= /var/tmp

# bench/engine.c and its rooms (bench/bench_engine.h).
BENCH_ENGINE_SRCS := bench/engine.c bench/engine_util.c bench/engine_run.c bench/engine_parts.c \
                     bench/engine_report.c

$(B)/bench-engine: $(call obj,$(BENCH_ENGINE_SRCS)) $(B)/libparallax.a
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LIBS) -lpthread -lm -o $@

bench-engine: $(B)/bench-engine

# Smoke run for make check: fails on engine errors, hangs, wrong data or plx_check errors; never
# judges times.
bench-smoke: $(B)/bench-engine
	@mkdir -p $(B)/test-logs
	@echo "bench-engine --quick: running (log: $(B)/test-logs/bench-engine-quick.txt)"
	@$(B)/bench-engine --quick --dir $(BENCH_DIR) --json $(B)/test-logs/bench-engine-quick.json \
	    > $(B)/test-logs/bench-engine-quick.txt 2>&1 \
	    || { tail -40 $(B)/test-logs/bench-engine-quick.txt; exit 1; }
	@echo "bench-engine --quick: ok"

# The side-by-side suite (bench/README.md, "Side by side"): Parallax vs qcow2 vs direct over NBD.
# `make bench` is the full run (about 25 minutes on 2 cores): results in
# bench/results/suite-HOST-STAMP/, plots in bench/plots/, and the results block of bench/README.md
# rewritten. Needs root for the file-system parts (loop devices, mounts).
bench: deps all $(B)/bench-handover $(B)/bench-scale
	bench/suite/run.sh --dir $(BENCH_DIR)
	bench/cluster.sh --dir $(BENCH_DIR)
	bench/scale.sh --dir $(BENCH_DIR)
	bench/clones.sh --dir $(BENCH_DIR)
	bench/wcache.sh --dir $(BENCH_DIR)
	bench/soak.sh --dir $(BENCH_DIR)

# Clones of the golden image (bench/README.md, "Clones"): space and boot time of 1, 10 and 30
# booted clones, Parallax vs qcow2 overlays vs raw copies, under QEMU TCG (about 12 minutes on
# 2 cores). Results in bench/results/clones-HOST-STAMP/, the figure in bench/plots/clones.png.
bench-wcache: deps all
	bench/wcache.sh --dir $(BENCH_DIR)

# The write cache through a real tapdisk against tapdisk's aio: (bench/README.md, "Through
# tapdisk"): needs a blktap build with the driver (tapdisk/build-into-blktap.sh) at
# $(BLKTAP_PREFIX) (default /var/tmp/blktap); without one the script says NOT RUN (exit 77),
# which is not a failure here. Not part of `make bench`.
BLKTAP_PREFIX ?= /var/tmp/blktap
bench-wcache-tapdisk: deps all
	bench/wcache-tapdisk.sh --dir $(BENCH_DIR) --blktap $(BLKTAP_PREFIX) || { rc=$$?; [ $$rc -eq 77 ]; }

bench-clones: deps all
	bench/clones.sh --dir $(BENCH_DIR)

# Smoke run for make check: 1 and 2 clones of each kind, one boot round; fails when any guest
# or step fails, judges no number (output in build/bench-clones-smoke).
bench-clones-smoke: deps all
	@mkdir -p $(B)/test-logs
	@bench/clones.sh --smoke --dir $(BENCH_DIR) > $(B)/test-logs/bench-clones-smoke.log 2>&1 \
	    || { tail -40 $(B)/test-logs/bench-clones-smoke.log; echo "bench-clones-smoke: FAILED"; exit 1; }
	@echo "bench/clones.sh --smoke: ok"

# Smoke run for make check: tiny sizes, every section, every server and figure; fails when any
# part fails. Never judges times, never writes into bench/ (output in build/bench-suite-smoke).
bench-suite-smoke: deps all
	@mkdir -p $(B)/test-logs
	@rm -rf $(B)/bench-suite-smoke
	@echo "bench/suite/run.sh --smoke: running, about 100 s (log: $(B)/test-logs/bench-suite-smoke.log)"
	@bench/suite/run.sh --smoke --dir $(BENCH_DIR) --out $(B)/bench-suite-smoke \
	    > $(B)/test-logs/bench-suite-smoke.log 2>&1 \
	    || { tail -40 $(B)/test-logs/bench-suite-smoke.log; echo "bench-suite-smoke: FAILED (log: $(B)/test-logs/bench-suite-smoke.log)"; exit 1; }
	@grep '^verify:' $(B)/test-logs/bench-suite-smoke.log || true
	@echo "bench/suite/run.sh --smoke: ok ($$(cat $(B)/bench-suite-smoke/raw/wall-seconds) s)"

# Costs against the snapshot count (bench/README.md, "Scale"); part of make bench.
$(B)/bench-scale: $(B)/obj/bench/scale.o $(B)/libparallax.a
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LIBS) -o $@

# Parallax on an iSCSI LUN against the raw LUN (bench/iscsi.sh starts tgtd and runs it).
$(B)/bench-iscsi: $(B)/obj/bench/iscsi.o $(B)/libparallax.a
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LIBS) -lpthread -o $@

bench-iscsi: $(B)/bench-iscsi deps
	bench/iscsi.sh --dir $(BENCH_DIR)

# Many hosts on one LUN (bench/cluster.sh starts tgtd, lockd and the hosts; part of `make bench`).
$(B)/bench-handover: $(B)/obj/bench/handover.o
	$(CC) $(CFLAGS) $(LDFLAGS) $^ -lnbd -o $@

# N raw writers on one LUN: the 1 MiB baseline of bench/cluster.sh.
$(B)/bench-lun-writers: $(B)/obj/bench/lun-writers.o $(B)/libparallax.a
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LIBS) -o $@

# A compressed month of a pool's life (bench/README.md, "Pool soak"): 3 hosts on a tgtd LUN,
# snapshots every "hour", gc every "day", a host and the lock manager lost (about 6 minutes).
bench-soak: deps all
	bench/soak.sh --dir $(BENCH_DIR)

# Smoke run for make check: 3 days of 6 hours, 6 small VDIs; fails when a flushed byte or a
# kept snapshot reads back wrong or the check is not clean; judges no space figure (about 15 s).
bench-soak-smoke: deps all
	@mkdir -p $(B)/test-logs
	@bench/soak.sh --quick --dir $(BENCH_DIR) > $(B)/test-logs/bench-soak-smoke.log 2>&1 \
	    || { tail -40 $(B)/test-logs/bench-soak-smoke.log; echo "bench-soak-smoke: FAILED"; exit 1; }
	@echo "bench/soak.sh --quick: ok"

bench-cluster: $(B)/bench-handover $(B)/bench-lun-writers deps all
	bench/cluster.sh --dir $(BENCH_DIR)

# Smoke run for make check: 1 and 3 hosts on a tgtd LUN, 1 s per run; fails when a run, a
# host's VDI verification or the check fails; judges no number (about 15 s).
bench-cluster-smoke: $(B)/bench-handover $(B)/bench-lun-writers deps all
	@mkdir -p $(B)/test-logs
	@bench/cluster.sh --smoke --dir $(BENCH_DIR) > $(B)/test-logs/bench-cluster-smoke.log 2>&1 \
	    || { tail -40 $(B)/test-logs/bench-cluster-smoke.log; echo "bench-cluster-smoke: FAILED"; exit 1; }
	@echo "bench/cluster.sh --smoke: ok"

# FUA writes in the engine and through NBD against a raw file (bench/README.md, "FUA writes").
$(B)/bench-fua: $(B)/obj/bench/fua.o $(B)/libparallax.a
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LIBS) -lnbd -o $@

# The write cache's own cost in this process against libaio on the local disk (bench/wcache.sh).
$(B)/bench-wcache-engine: $(B)/obj/bench/wcache-engine.o $(B)/libparallax.a
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LIBS) -o $@

# The writer that bench/gc.sh runs beside the collector.
$(B)/bench-gc-writer: $(B)/obj/bench/gc-writer.o $(B)/libparallax.a
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LIBS) -o $@

clean:
	rm -rf $(B)

# make install / make uninstall (PREFIX, DESTDIR, ...): see mk/install.mk.
include mk/install.mk

# Header dependencies written by -MMD (none before the first build). Only the object trees: the
# rest of build/ holds unpacked Debian packages (the Xen lab), whose etc/*.d are no makefiles.
-include $(shell find $(B)/obj $(B)/san $(B)/test/obj -name '*.d' -type f 2>/dev/null)

.PHONY: all lab-packages unit unit-san unit-all check-long crash-long integration lint layers format check check-xen xen-lab xendeps builddeps deps demo clean bench-engine bench-smoke bench bench-iscsi bench-cluster bench-cluster-smoke bench-soak bench-soak-smoke bench-wcache-tapdisk FORCE \
        bench-suite-smoke bench-clones bench-clones-smoke bench-wcache bench-smokes
