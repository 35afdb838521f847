# jlmfs - build. `make` builds the library, the `jlm` and `jlmfs` tools; `make test`
# builds and runs the Criterion suite. BUILD=dir puts every output under dir
# (parallel builds of one tree use different BUILD dirs so they never race).
#
# Targets and what their flags risk:
#   all     -O2 -g. In a git checkout (and so in CI) -Werror is on: a new compiler
#           warning breaks the build, on purpose. A release tarball (no .git) builds
#           without it, so a packager's newer compiler does not fail the build;
#           WERROR=-Werror turns it on there, WERROR= turns it off here.
#   debug   the suite built and run under ASan + UBSan (-O1, build-debug/): ~3x slower;
#           one test process at a time (Criterion's workers and ASan's arena clash).
#   (no tsan target: Criterion 2.4 cannot map its inheritable arena under
#           ThreadSanitizer, "Could not initialize inheritable arena", so the suite
#           cannot run under it; see docs/architecture.md.)
#   test    builds the suite and runs it (Criterion's closing line is what CI reads).
#   bench   benchmarks in bench/, printing ratios against an in-run baseline.
#   fuzz    libFuzzer targets (clang); needs libclang-rt-14-dev.
#   install PREFIX=/usr/local; mount.jlmfs goes to SBINDIR (default /sbin: mount(8) looks
#           only there for helpers).
# Honours CC, CPPFLAGS, CFLAGS, LDFLAGS and DESTDIR as packagers expect.

BUILD   ?= build
PREFIX  ?= /usr/local
SBINDIR ?= /sbin
CC      ?= cc
PKGS    := fuse3 sqlite3 jansson libutf8proc
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

OPT     ?= -O2 -g
CFLAGS  ?=
CPPFLAGS ?=
WERROR  ?= $(if $(wildcard .git),-Werror)
WARN    := -Wall -Wextra $(WERROR) -Wno-unused-parameter
# -ffp-contract=off: no a*b+c fused behind our back. The reference kernels, the
# dequantization oracle and the SIMD kernels are compared bit for bit, and the
# converted containers and generated ids must not depend on the compiler's mood
# (-std=c11 implies it in GCC; saying it keeps it true under other modes/compilers).
BASECFLAGS := -std=c11 -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 $(CPPFLAGS) $(OPT) $(WARN) -fno-strict-aliasing \
              -ffp-contract=off -pthread -I. $(PKG_CFLAGS) $(CFLAGS)
LDLIBS  := $(PKG_LIBS) -lm -pthread

# Per-ISA kernel files carry their own -m flags; the dispatcher picks at run time.
AVX2_FLAGS   := -mavx2 -mfma -mf16c
AVX512_FLAGS := -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni

LIB_DIRS := base format converter kernels/cpu kernels/vulkan engine text/tokenizer text/template residency fs picture
LIB_SRC  := $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
LIB      := $(BUILD)/libjlm.a

CLI_SRC  := $(wildcard cli/*.c)
BINS     := $(BUILD)/jlm $(if $(wildcard cli/jlmfs_main.c),$(BUILD)/jlmfs)

TEST_SRC := $(wildcard tests/test_*.c)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(BUILD)/jlm-tests

BENCH_SRC := $(wildcard bench/*.c)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all debug test bench fuzz install clean
all: $(LIB) $(BINS)

debug:
	$(MAKE) BUILD=build-debug OPT="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer" \
	    LDFLAGS="-fsanitize=address,undefined" test TESTARGS="-j1 $(TESTARGS)"

$(BUILD)/obj/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(BASECFLAGS) $(AVX2_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(BASECFLAGS) $(AVX512_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(BASECFLAGS) -MMD -MP -c $< -o $@

# picture/page.css and page.js become C strings in $(BUILD)/gen/picture/picture_assets.h
# (one "line\n" literal per line; '?' escaped so no trigraph can form).
PIC_ASSETS := $(BUILD)/gen/picture/picture_assets.h
$(PIC_ASSETS): picture/page.css picture/page.js
	@mkdir -p $(dir $@)
	{ for a in css js; do echo "#define PICTURE_PAGE_$$(echo $$a | tr a-z A-Z) \\"; \
	    sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/?/\\?/g' -e 's/^/    "/' -e 's/$$/\\n" \\/' picture/page.$$a; \
	    echo '    ""'; done; } > $@.tmp && mv $@.tmp $@
$(BUILD)/obj/picture/picture.o: $(PIC_ASSETS)
$(BUILD)/obj/picture/picture.o: BASECFLAGS += -I$(BUILD)/gen

# The Vulkan backend: kernels/vulkan/shaders/*.comp compiled by glslc into
# $(BUILD)/gen/kernels/vulkan/*.spv.h (C initializers, embedded by vk.c). Without
# the Vulkan headers or glslc the backend is left out (vk.c's stub says so at
# run time) and make says so here.
VK_OK := $(shell pkg-config --exists vulkan 2>/dev/null && command -v glslc >/dev/null 2>&1 && echo 1)
VK_SPV := $(patsubst kernels/vulkan/shaders/%.comp,$(BUILD)/gen/kernels/vulkan/%.spv.h,$(wildcard kernels/vulkan/shaders/*.comp))
ifeq ($(VK_OK),1)
LDLIBS += $(shell pkg-config --libs vulkan)
$(BUILD)/obj/kernels/vulkan/vk.o: $(VK_SPV)
$(BUILD)/obj/kernels/vulkan/vk.o: BASECFLAGS += -DJLM_HAVE_VULKAN -I$(BUILD)/gen $(shell pkg-config --cflags vulkan)
else
$(info make: Vulkan backend left out (needs pkg-config vulkan and glslc: scripts/deps.sh installs them))
endif
$(BUILD)/gen/kernels/vulkan/%.spv.h: kernels/vulkan/shaders/%.comp
	@mkdir -p $(dir $@)
	glslc -fshader-stage=compute -O -mfmt=c $< -o $@.tmp && mv $@.tmp $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/jlm: $(BUILD)/obj/cli/jlm_main.o $(filter-out $(BUILD)/obj/cli/jlmfs_main.o,$(CLI_SRC:%.c=$(BUILD)/obj/%.o)) $(LIB)
	$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(LIB) $(LDLIBS)

$(BUILD)/jlmfs: $(BUILD)/obj/cli/jlmfs_main.o $(LIB)
	$(CC) $(LDFLAGS) -o $@ $< $(LIB) $(LDLIBS)

$(TEST_BIN): $(TEST_OBJ) $(LIB)
	$(CC) $(LDFLAGS) -o $@ $(TEST_OBJ) $(LIB) $(LDLIBS) -lcriterion

# The suite finds the tools and fixtures through these variables.
test: all $(TEST_BIN)
	JLM_BIN=$(abspath $(BUILD)/jlm) JLM_ROOT=$(CURDIR) $(TEST_BIN) $(TESTARGS)

# benches include bench/mkgguf.c and bench/*.h: rebuild them when those change
$(BUILD)/bench/%: bench/%.c $(wildcard bench/*.h) bench/mkgguf.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(BASECFLAGS) -o $@ $< $(LIB) $(LDLIBS)

bench: all $(BENCH_BIN)
	@for b in $(BENCH_BIN); do echo "== $$b"; JLM_BIN=$(abspath $(BUILD)/jlm) $$b || exit 1; done

# Fuzz targets (clang + libFuzzer). Run one with e.g.
#   mkdir -p /tmp/corpus && build-fuzz/fuzz_gguf -max_total_time=60 /tmp/corpus tests/models/vocab
# (the first directory receives new inputs: never point it into the tree)
FUZZ_SRC := base/jlm_err.c base/io.c format/types.c format/codec.c format/plan.c format/reader.c format/writer.c \
            converter/gguf.c converter/ggml_quants.c
# fuzz_picture also needs the picture, the residency code and their libraries.
FUZZ_PIC := picture/picture.c residency/residency.c -I$(BUILD)/gen $(PKG_CFLAGS) $(PKG_LIBS)
fuzz: $(PIC_ASSETS)
	@mkdir -p build-fuzz
	for f in tests/fuzz/fuzz_*.c; do \
	    case $$f in *picture*) extra="$(FUZZ_PIC)";; *) extra="";; esac; \
	    clang -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -I. $$f $(FUZZ_SRC) $$extra -lm \
	        -o build-fuzz/$$(basename $$f .c) || exit 1; done

install: all
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 755 $(BINS) $(DESTDIR)$(PREFIX)/bin/
	install -d $(DESTDIR)$(SBINDIR)
	install -m 755 mount-helpers/mount.jlmfs $(DESTDIR)$(SBINDIR)/mount.jlmfs

clean:
	rm -rf build build-*

CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
-include $(LIB_OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(CLI_OBJ:.o=.d)
