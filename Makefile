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
#   tsan    the tools built under ThreadSanitizer (build-tsan/) driven by tests/tsan.sh:
#           the engine's pool and pager, `jlm serve` with concurrent requests, the
#           daemon converting while readers and an engine read its views. (Criterion
#           2.4 cannot start under TSan, "Could not initialize inheritable arena", so
#           the suite itself does not run under it; see docs/architecture.md.)
#   test    builds the suite and runs it (Criterion's closing line is what CI reads).
#   bench   benchmarks in bench/, printing ratios against an in-run baseline.
#   bench-build  builds every bench without running one (CI: they must compile).
#   soak    tests/soak.sh: the full-size soak of issue 10 (about 75 s; not in test).
#   fuzz    libFuzzer targets and seed corpora (clang); needs libclang-rt-14-dev.
#   fuzz-smoke  every fuzz target for FUZZ_SECONDS (60) each.
#   layout-glsl  rewrites kernels/vulkan/layout.glsl from kernels/layout.h (every
#           build fails while the two differ).
#   cuda-check  build/jlm-cuda-check, the CUDA kernels on a device (skips in one line
#           without one); CUDA=0 leaves every .cu out (docs/cuda.md).
#   install PREFIX=/usr/local; mount.jlmfs goes to SBINDIR (default /sbin: mount(8) looks
#           only there for helpers), with the path of the jlmfs installed beside it; man
#           pages into $(PREFIX)/share/man, bash completion into
#           $(PREFIX)/share/bash-completion/completions, the systemd examples (with the
#           installed paths) into $(PREFIX)/share/doc/jlmfs/examples.
#   uninstall  removes exactly what install put (same PREFIX, SBINDIR, DESTDIR).
# Honours CC, CPPFLAGS, CFLAGS, LDFLAGS and DESTDIR as packagers expect.

BUILD   ?= build
PREFIX  ?= /usr/local
SBINDIR ?= /sbin
BINDIR  ?= $(PREFIX)/bin
MANDIR  ?= $(PREFIX)/share/man
COMPDIR ?= $(PREFIX)/share/bash-completion/completions
EXDIR   ?= $(PREFIX)/share/doc/jlmfs/examples
CC      ?= cc
PKGS    := fuse3 sqlite3 jansson libutf8proc libmicrohttpd libedit libpng libjpeg
# stb: only the tests' image writer (stb_image_write); the engine decodes with
# libpng and libjpeg-turbo (docs/vision.md says why not stb).
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) stb 2>/dev/null)
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

# CUDA: auto-detected (nvcc at $(NVCC)); `make CUDA=0` builds the stub probe and no .cu.
# With CUDA=1 the library gains kernels/cuda/kernels.cu (nvcc, sm_80 + sm_90, ~7 s) and
# links the static CUDA runtime, so binaries run where only the driver exists.
NVCC      ?= /usr/local/cuda/bin/nvcc
CUDA      ?= $(if $(wildcard $(NVCC)),1,0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCH := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
CUDA_LIBS := $(if $(filter 1,$(CUDA)),-L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++)
LDLIBS    += $(CUDA_LIBS)

LIB_DIRS := base format converter kernels/cpu kernels/cuda kernels/vulkan engine engine/arch text/tokenizer text/template text/grammar prompt residency fs picture serve
LIB_SRC  := $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
LIB_OBJ  += $(if $(filter 1,$(CUDA)),$(BUILD)/obj/kernels/cuda/kernels.o)
LIB      := $(BUILD)/libjlm.a

CLI_SRC  := $(wildcard cli/*.c)
BINS     := $(BUILD)/jlm $(if $(wildcard cli/jlmfs_main.c),$(BUILD)/jlmfs)

TEST_SRC := $(wildcard tests/test_*.c)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(BUILD)/jlm-tests

BENCH_SRC := $(wildcard bench/*.c)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all layout-glsl debug tsan test bench bench-build soak fuzz fuzz-smoke install uninstall clean cuda-check
all: $(LIB) $(BINS)

debug:
	$(MAKE) BUILD=build-debug OPT="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer" \
	    LDFLAGS="-fsanitize=address,undefined" test TESTARGS="-j1 $(TESTARGS)"

tsan:
	$(MAKE) BUILD=build-tsan OPT="-O1 -g -fsanitize=thread" LDFLAGS="-fsanitize=thread" all
	JLM_BIN=$(CURDIR)/build-tsan/jlm JLMFS_BIN=$(CURDIR)/build-tsan/jlmfs tests/tsan.sh

$(BUILD)/obj/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(BASECFLAGS) $(AVX2_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(BASECFLAGS) $(AVX512_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/kernels/cuda/device.o $(BUILD)/obj/kernels/cuda/rt.o: BASECFLAGS += $(if $(filter 1,$(CUDA)),-DJLM_CUDA=1 -I$(CUDA_HOME)/include)

# -fmad=false: no FMA contraction, as -ffp-contract=off on the host (body.h invariant 1)
$(BUILD)/obj/%.o: %.cu kernels/cuda/body.h kernels/layout.h
	@mkdir -p $(dir $@)
	$(NVCC) -std=c++17 -O3 -fmad=false -I. $(CUDA_ARCH) -c $< -o $@

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

# kernels/layout.h declares the layouts C, CUDA and the shaders share; the
# shaders read them from kernels/vulkan/layout.glsl, which every build compares
# with what kernels/vulkan/gen/layout_glsl.c writes from layout.h: a difference
# fails the build. `make layout-glsl` rewrites the file.
LAYOUT_GEN := $(BUILD)/gen/layout_glsl
LAYOUT_OK  := $(BUILD)/gen/kernels/vulkan/layout.ok
$(LAYOUT_GEN): kernels/vulkan/gen/layout_glsl.c kernels/layout.h
	@mkdir -p $(dir $@)
	$(CC) $(BASECFLAGS) $(LDFLAGS) -o $@ $<
$(LAYOUT_OK): $(LAYOUT_GEN) kernels/vulkan/layout.glsl
	@mkdir -p $(dir $@)
	@$(LAYOUT_GEN) > $@.tmp && diff -u kernels/vulkan/layout.glsl $@.tmp || \
	    { echo "make: kernels/vulkan/layout.glsl differs from kernels/layout.h (above); make layout-glsl rewrites it"; exit 1; }
	@mv $@.tmp $@
layout-glsl: $(LAYOUT_GEN)
	$(LAYOUT_GEN) > kernels/vulkan/layout.glsl.tmp && mv kernels/vulkan/layout.glsl.tmp kernels/vulkan/layout.glsl

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
$(BUILD)/gen/kernels/vulkan/%.spv.h: kernels/vulkan/shaders/%.comp $(wildcard kernels/vulkan/*.glsl) $(LAYOUT_OK)
	@mkdir -p $(dir $@)
	glslc -fshader-stage=compute -O -Ikernels/vulkan -mfmt=c $< -o $@.tmp && mv $@.tmp $@

$(LIB): $(LIB_OBJ) $(LAYOUT_OK)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $(LIB_OBJ)

$(BUILD)/jlm: $(BUILD)/obj/cli/jlm_main.o $(filter-out $(BUILD)/obj/cli/jlmfs_main.o,$(CLI_SRC:%.c=$(BUILD)/obj/%.o)) $(LIB)
	$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(LIB) $(LDLIBS)

$(BUILD)/jlmfs: $(BUILD)/obj/cli/jlmfs_main.o $(LIB)
	$(CC) $(LDFLAGS) -o $@ $< $(LIB) $(LDLIBS)

$(TEST_BIN): $(TEST_OBJ) $(LIB)
	$(CC) $(LDFLAGS) -o $@ $(TEST_OBJ) $(LIB) $(LDLIBS) $(shell pkg-config --libs stb) -lcriterion

# The suite finds the tools and fixtures through these variables.
test: all $(TEST_BIN)
	JLM_BIN=$(abspath $(BUILD)/jlm) JLM_ROOT=$(CURDIR) $(TEST_BIN) $(TESTARGS)

# benches include bench/mkgguf.c and bench/*.h: rebuild them when those change
$(BUILD)/bench/%: bench/%.c $(wildcard bench/*.h) bench/mkgguf.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(BASECFLAGS) -o $@ $< $(LIB) $(LDLIBS)

# The device check and CUDA matvec bandwidth bench (bench/gpu-check.sh runs it on a GPU
# machine). Self-contained: links only libjlm's kernel objects, libm and the static CUDA
# runtime, so it runs where SQLite, jansson, FUSE and Criterion are absent.
CUDA_CHECK := $(BUILD)/jlm-cuda-check
cuda-check: $(CUDA_CHECK)
$(CUDA_CHECK): tests/cuda/device_check.c $(LIB)
	$(CC) $(BASECFLAGS) $(if $(filter 1,$(CUDA)),-DJLM_CUDA=1 -I$(CUDA_HOME)/include) $(LDFLAGS) \
	    -o $@ $< $(LIB) $(CUDA_LIBS) -lm -pthread

# The engine on CUDA against the CPU, and its speed (tests/cuda/engine_check.c;
# bench/gpu-check.sh runs it on a GPU machine). Self-contained as jlm-cuda-check:
# jansson linked statically, Vulkan left out (vk.c's stub, built again without
# JLM_HAVE_VULKAN), so it needs no library the GPU machine may lack.
CUDA_ENGINE := $(BUILD)/jlm-cuda-engine
cuda-check: $(CUDA_ENGINE)
$(BUILD)/obj/cuda-engine/vk_stub.o: kernels/vulkan/vk.c
	@mkdir -p $(dir $@)
	$(CC) $(BASECFLAGS) -MMD -MP -c $< -o $@
-include $(BUILD)/obj/cuda-engine/vk_stub.d
$(CUDA_ENGINE): tests/cuda/engine_check.c $(BUILD)/obj/cuda-engine/vk_stub.o $(LIB)
	$(CC) $(BASECFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/obj/cuda-engine/vk_stub.o $(LIB) \
	    -Wl,-Bstatic -ljansson -Wl,-Bdynamic $(CUDA_LIBS) -lm -pthread

# The full-size soak of issue 10 (8 readers, 60 s, the engine through the
# mount, the source replaced, rewritten and renamed): not in `test`; .ci/run runs it.
soak: all
	JLM_BIN_DIR=$(abspath $(BUILD)) tests/soak.sh

# bench-build: every bench compiles (CI), without running them
bench-build: all $(BENCH_BIN)

bench: all $(BENCH_BIN)
	@for b in $(BENCH_BIN); do echo "== $$b"; JLM_BIN=$(abspath $(BUILD)/jlm) $$b || exit 1; done

# Fuzz targets (clang + libFuzzer): the library is built once more with
# clang, ASan and UBSan (build-fuzz/lib), each tests/fuzz/fuzz_*.c is linked
# against it, and tests/fuzz/mkseeds.c writes the seed corpora into
# build-fuzz/seeds/{convert,engine,tokenizer,jinja} (the crafted inputs of
# issue 10 included).
# Run one with e.g.
#   mkdir -p /tmp/corpus && build-fuzz/fuzz_convert -max_total_time=60 /tmp/corpus build-fuzz/seeds/convert
# (the first directory receives new inputs: never point it into the tree).
# `make fuzz-smoke` runs every target for FUZZ_SECONDS (default 60) each.
FUZZ_FLAGS := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer
FUZZ_LIB   := build-fuzz/lib/libjlm.a
FUZZ_SECONDS ?= 60
fuzz:
	$(MAKE) BUILD=build-fuzz/lib CC=clang OPT="$(FUZZ_FLAGS) -fsanitize=fuzzer-no-link" $(FUZZ_LIB)
	for f in tests/fuzz/fuzz_*.c; do \
	    clang -std=c11 -D_GNU_SOURCE $(FUZZ_FLAGS) -fsanitize=fuzzer -I. $$f $(FUZZ_LIB) $(LDLIBS) \
	        -o build-fuzz/$$(basename $$f .c) || exit 1; done
	clang -std=c11 -D_GNU_SOURCE $(FUZZ_FLAGS) -I. tests/fuzz/mkseeds.c $(FUZZ_LIB) $(LDLIBS) -o build-fuzz/mkseeds
	rm -rf build-fuzz/seeds && build-fuzz/mkseeds build-fuzz/seeds

fuzz-smoke: fuzz
	@for t in build-fuzz/fuzz_*; do \
	    [ -f $$t ] && [ -x $$t ] || continue; \
	    n=$$(basename $$t); seeds=""; \
	    case $$n in fuzz_convert|fuzz_gguf) seeds=build-fuzz/seeds/convert;; fuzz_engine|fuzz_jlm) seeds=build-fuzz/seeds/engine;; \
	    fuzz_tokenizer) seeds=build-fuzz/seeds/tokenizer;; fuzz_jinja) seeds="build-fuzz/seeds/jinja tests/fuzz/seeds-jinja";; \
	    fuzz_serve_req) seeds=tests/fuzz/seeds-serve-req;; fuzz_mmproj) seeds=tests/fuzz/seeds-mmproj;; \
	    fuzz_safetensors) seeds=tests/fuzz/seeds-safetensors;; fuzz_image) seeds=tests/fuzz/seeds-image;; fuzz_hf_tokenizer) seeds=tests/fuzz/seeds-hf-tokenizer;; \
	    fuzz_cli_opts) seeds=tests/fuzz/seeds-cli-opts;; fuzz_grammar) seeds=tests/fuzz/seeds-grammar;; \
	    fuzz_sums) seeds=tests/fuzz/seeds-sums;; fuzz_routing) seeds=tests/fuzz/seeds-routing;; \
	    fuzz_toolcall) seeds=tests/fuzz/seeds-toolcall;; esac; \
	    rm -rf build-fuzz/corpus/$$n && mkdir -p build-fuzz/corpus/$$n; \
	    echo "== $$n ($(FUZZ_SECONDS) s)"; \
	    $$t -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
	        -artifact_prefix=build-fuzz/ build-fuzz/corpus/$$n $$seeds > build-fuzz/$$n.log 2>&1; rc=$$?; \
	    grep -E "stat::number_of_executed_units|Done" build-fuzz/$$n.log; \
	    [ $$rc -eq 0 ] || { tail -40 build-fuzz/$$n.log; exit 1; }; done

MANPAGES := docs/man/jlm.1 docs/man/jlmfs.1 docs/man/mount.jlmfs.8
EXAMPLES := mount-helpers/jlmfs@.service mount-helpers/srv-models.mount
install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(SBINDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man8 \
	    $(DESTDIR)$(COMPDIR) $(DESTDIR)$(EXDIR)
	install -m 755 $(BINS) $(DESTDIR)$(BINDIR)/
	sed 's|@JLMFS_INSTALLED@|$(BINDIR)/jlmfs|' mount-helpers/mount.jlmfs > $(DESTDIR)$(SBINDIR)/mount.jlmfs.tmp
	chmod 755 $(DESTDIR)$(SBINDIR)/mount.jlmfs.tmp && mv $(DESTDIR)$(SBINDIR)/mount.jlmfs.tmp $(DESTDIR)$(SBINDIR)/mount.jlmfs
	install -m 644 $(filter %.1,$(MANPAGES)) $(DESTDIR)$(MANDIR)/man1/
	install -m 644 $(filter %.8,$(MANPAGES)) $(DESTDIR)$(MANDIR)/man8/
	install -m 644 scripts/completion/jlm $(DESTDIR)$(COMPDIR)/jlm
	ln -sf jlm $(DESTDIR)$(COMPDIR)/jlmfs
	for f in $(EXAMPLES); do sed 's|/usr/local/bin/jlmfs|$(BINDIR)/jlmfs|g' $$f > $(DESTDIR)$(EXDIR)/$$(basename $$f); done

# Removes what install wrote and its own doc folder. System folders (bin, man1,
# completions) stay even if empty; under a DESTDIR staging root, every folder
# left empty is removed too, so install + uninstall there leaves nothing.
uninstall:
	rm -f $(addprefix $(DESTDIR)$(BINDIR)/,jlm jlmfs) $(DESTDIR)$(SBINDIR)/mount.jlmfs \
	    $(addprefix $(DESTDIR)$(MANDIR)/man1/,jlm.1 jlmfs.1) $(DESTDIR)$(MANDIR)/man8/mount.jlmfs.8 \
	    $(DESTDIR)$(COMPDIR)/jlm $(DESTDIR)$(COMPDIR)/jlmfs $(addprefix $(DESTDIR)$(EXDIR)/,$(notdir $(EXAMPLES)))
	-rmdir $(DESTDIR)$(EXDIR) $(DESTDIR)$(dir $(EXDIR)) 2>/dev/null
	$(if $(DESTDIR),-find $(DESTDIR) -depth -type d -empty -delete)

clean:
	rm -rf build build-*

CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
-include $(LIB_OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(CLI_OBJ:.o=.d)
