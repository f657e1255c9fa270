# Parallax build. `make` builds the library and the `parallax` command; `make check` builds and
# runs every test (unit tests plain and under ASan+UBSan, integration scripts, cppcheck, and smoke
# runs of the engine benchmark and the side-by-side suite); `make bench` runs the full suite.

CC      ?= cc
CFLAGS  ?= -O2 -g
WARN    := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes \
           -Wmissing-prototypes -Wno-unused-parameter
INC     := -Ilibparallax/include -Ilibparallax
LIBS    := -laio
B       := build

LIB_SRCS  := $(filter-out libparallax/backend_fault.c,$(wildcard libparallax/*.c))
TEST_LIB_SRCS := libparallax/backend_fault.c tests/unit/testutil.c
LIB_HDRS  := $(wildcard libparallax/*.h libparallax/include/*.h)
TOOL_SRCS := $(wildcard tools/*.c) $(wildcard gc/*.c) tapdisk/control_client.c \
             tapdisk/nbd_server.c tapdisk/engine_thread.c tapdisk/control_server.c \
             tapdisk/export_names.c
PLUGIN_SRCS := tapdisk/nbd_plugin.c tapdisk/engine_thread.c tapdisk/control_server.c \
               tapdisk/control_client.c tapdisk/export_names.c
UNIT_SRCS := $(filter-out tests/unit/testutil.c,$(wildcard tests/unit/test_*.c))

all: $(B)/libparallax.a $(B)/libparallax.so $(B)/parallax $(B)/nbdkit-parallax-plugin.so

# ---- the library -------------------------------------------------------------------------------
$(B)/obj/%.o: %.c $(LIB_HDRS) | $(B) builddeps
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) -fPIC $(INC) -c $< -o $@

$(B)/libparallax.a: $(LIB_SRCS:%.c=$(B)/obj/%.o)
	rm -f $@ && ar rcs $@ $^

$(B)/libparallax.so: $(LIB_SRCS:%.c=$(B)/obj/%.o)
	$(CC) -shared -Wl,-soname,libparallax.so.1 -o $@ $^ $(LIBS)

$(B)/parallax: $(TOOL_SRCS) $(B)/libparallax.a $(LIB_HDRS) $(wildcard tools/*.h tapdisk/*.h) | builddeps
	$(CC) $(WARN) $(CFLAGS) $(INC) -Itools -Itapdisk $(TOOL_SRCS) $(B)/libparallax.a $(LIBS) -lpthread -o $@

# The NBD export: an nbdkit plugin with the engine linked in (`parallax serve` runs nbdkit).
$(B)/nbdkit-parallax-plugin.so: $(PLUGIN_SRCS) $(wildcard tapdisk/*.h) $(B)/libparallax.a | builddeps
	$(CC) $(WARN) $(CFLAGS) -fPIC -shared -fvisibility=hidden $(INC) -Itapdisk $(PLUGIN_SRCS) \
	    $(B)/libparallax.a $(LIBS) -lpthread -o $@

$(B):
	@mkdir -p $(B)

# ---- unit tests (Check), plain and sanitized -------------------------------------------------
CHECK_LIBS = $(shell pkg-config --libs check 2>/dev/null || echo -lcheck -lsubunit -lm -lrt -lpthread)
SAN := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

# Extra sources of a unit test besides the library: EXTRA_<test>.
EXTRA_test_tapdisk := tapdisk/block-parallax.c tests/unit/tapdisk_double.c
TEST_HDRS := $(wildcard tests/unit/*.h tapdisk/*.h)

.SECONDEXPANSION:
$(B)/unit/%: tests/unit/%.c $(LIB_SRCS) $(TEST_LIB_SRCS) $(LIB_HDRS) $(TEST_HDRS) $$(EXTRA_$$*) | builddeps
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(INC) -Itests/unit -Itapdisk $< $(EXTRA_$*) $(LIB_SRCS) $(TEST_LIB_SRCS) $(LIBS) $(CHECK_LIBS) -o $@

$(B)/unit-san/%: tests/unit/%.c $(LIB_SRCS) $(TEST_LIB_SRCS) $(LIB_HDRS) $(TEST_HDRS) $$(EXTRA_$$*) | builddeps
	@mkdir -p $(dir $@)
	$(CC) $(WARN) -O1 -g $(SAN) $(INC) -Itests/unit -Itapdisk $< $(EXTRA_$*) $(LIB_SRCS) $(TEST_LIB_SRCS) $(LIBS) $(CHECK_LIBS) -o $@

UNIT_BINS     := $(UNIT_SRCS:tests/unit/%.c=$(B)/unit/%)
UNIT_SAN_BINS := $(UNIT_SRCS:tests/unit/%.c=$(B)/unit-san/%)

unit: $(UNIT_BINS)
	@tests/run-unit.sh $(UNIT_BINS)

unit-san: $(UNIT_SAN_BINS)
	@PLX_TEST_QUICK=1 ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 tests/run-unit.sh $(UNIT_SAN_BINS)

integration: all deps
	@tests/run-integration.sh

lint: builddeps
	cppcheck --quiet --error-exitcode=1 --enable=warning,performance,portability \
	    --inline-suppr --suppress=missingIncludeSystem -Ilibparallax/include -Ilibparallax \
	    libparallax tools gc tapdisk

format: builddeps
	clang-format -i $(wildcard libparallax/*.[ch] libparallax/include/*.h tools/*.[ch] gc/*.[ch] tests/unit/*.[ch])

check: deps all unit unit-san integration lint bench-smoke bench-suite-smoke bench-clones-smoke
	@echo "make check: all passed"

builddeps:
	@scripts/install-deps.sh build

deps: builddeps
	@scripts/install-deps.sh test

demo: builddeps all
	@scripts/demo.sh

# ---- engine benchmark (bench/README.md) ----------------------------------------------------------
BENCH_DIR ?= /var/tmp

$(B)/bench-engine: bench/engine.c $(B)/libparallax.a $(LIB_HDRS) | builddeps
	$(CC) $(WARN) $(CFLAGS) $(INC) $< $(B)/libparallax.a $(LIBS) -lpthread -lm -o $@

bench-engine: $(B)/bench-engine

# Smoke run for make check: fails on engine errors, hangs, wrong data or plx_check errors; never
# judges times.
bench-smoke: $(B)/bench-engine
	@mkdir -p $(B)/test-logs
	@$(B)/bench-engine --quick --dir $(BENCH_DIR) --json $(B)/test-logs/bench-engine-quick.json \
	    > $(B)/test-logs/bench-engine-quick.txt 2>&1 \
	    || { tail -40 $(B)/test-logs/bench-engine-quick.txt; exit 1; }
	@echo "bench-engine --quick: ok"

# The side-by-side suite (bench/README.md, "Side by side"): Parallax vs qcow2 vs direct over NBD.
# `make bench` is the full run (about 18-20 minutes on 2 cores): results in
# bench/results/suite-HOST-STAMP/, plots in bench/plots/, and the results block of bench/README.md
# rewritten. Needs root for the file-system parts (loop devices, mounts).
bench: deps all
	bench/suite/run.sh --dir $(BENCH_DIR)
	bench/clones.sh --dir $(BENCH_DIR)

# Clones of the golden image (bench/README.md, "Clones"): space and boot time of 1, 10 and 30
# booted clones, Parallax vs qcow2 overlays vs raw copies, under QEMU TCG (about 12 minutes on
# 2 cores). Results in bench/results/clones-HOST-STAMP/, the figure in bench/plots/clones.png.
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
	@bench/suite/run.sh --smoke --dir $(BENCH_DIR) --out $(B)/bench-suite-smoke \
	    > $(B)/test-logs/bench-suite-smoke.log 2>&1 \
	    || { tail -40 $(B)/test-logs/bench-suite-smoke.log; echo "bench-suite-smoke: FAILED (log: $(B)/test-logs/bench-suite-smoke.log)"; exit 1; }
	@grep '^verify:' $(B)/test-logs/bench-suite-smoke.log || true
	@echo "bench/suite/run.sh --smoke: ok ($$(cat $(B)/bench-suite-smoke/raw/wall-seconds) s)"

# The writer that bench/gc.sh runs beside the collector.
$(B)/bench-gc-writer: bench/gc-writer.c $(B)/libparallax.a | builddeps
	$(CC) $(WARN) $(CFLAGS) $(INC) $< $(B)/libparallax.a $(LIBS) -o $@

clean:
	rm -rf $(B)

.PHONY: all unit unit-san integration lint format check builddeps deps demo clean bench-engine bench-smoke bench \
        bench-suite-smoke bench-clones bench-clones-smoke
